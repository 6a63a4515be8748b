/* SPDX-License-Identifier: Apache-2.0 */
/* Corpus replay driver: runs a fuzz target over every file in the directories given, so the
 * corpus is a regression test in every build (libFuzzer itself only in the fuzz build). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            uint8_t *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = b;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        if (n == 0)
            break;
        len += n;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "replay: cannot open corpus %s\n", argv[i]);
            return 1;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            char p[4096];
            snprintf(p, sizeof(p), "%s/%s", argv[i], de->d_name);
            if (run_file(p) < 0) {
                fprintf(stderr, "replay: cannot read %s\n", p);
                closedir(d);
                return 1;
            }
            files++;
        }
        closedir(d);
    }
    if (files == 0) {
        fprintf(stderr, "replay: empty corpus\n");
        return 1;
    }
    printf("replayed %d inputs\n", files);
    return 0;
}
