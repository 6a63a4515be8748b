/* SPDX-License-Identifier: Apache-2.0 */
/* Minimal test helpers: CHECK macros that report file:line and fail the program, temp dirs,
 * running the CLI, and skip (exit 77, or 1 when VMSNAP_REQUIRE_ALL=1). */
#ifndef VMSNAP_T_H
#define VMSNAP_T_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern int t_failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

/* Abort the test now (a failed precondition). */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond);             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Exit 77 with a reason (or 1 under VMSNAP_REQUIRE_ALL=1). */
_Noreturn void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print the verdict and return the exit code for main. */
int t_done(void);

/* A fresh temporary directory (removed by t_cleanup). */
const char *t_tmpdir(void);
void t_cleanup(void);
/* Join dir and name into a static rotating buffer. */
const char *t_path(const char *name);

/* Deterministic PRNG (xorshift64*). */
uint64_t t_rand(uint64_t *state);

/* Run a shell command; return its exit status (or -1). Output goes to the test log. */
int t_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Read a whole file (caller frees); returns NULL on error. */
uint8_t *t_read_file(const char *path, size_t *len);
/* Compare two files byte for byte; returns true when equal. */
bool t_files_equal(const char *a, const char *b);
/* Allocated bytes of a file (st_blocks * 512). */
uint64_t t_allocated(const char *path);
bool t_exists(const char *path);

#endif
