/* SPDX-License-Identifier: Apache-2.0 */
/* Private: the incremental extent-record parser (see image_rec.c). */
#ifndef VMSNAP_IMAGE_REC_H
#define VMSNAP_IMAGE_REC_H

#include "image_int.h"
#include "util/util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum rec_state { REC_TOTAL, REC_OFF, REC_LEN, REC_DATA, REC_DONE };

struct rec_parser {
    enum rec_state state;
    uint8_t word[8];
    unsigned fill;
    uint64_t off;
    uint64_t data_off, data_left;
    uint64_t total;
    bool have_total;
    bool table_total;       /* max_size is the seek table's totalSize: another one is damage */
    bool truncate_on_total; /* ftruncate fd to totalSize when it is read */
    bool allow_sentinel;
    uint64_t max_size;
    uint64_t next_min; /* extents must start at or after this */
    uint64_t lo, hi;   /* the frame's source range */
    uint64_t pos;      /* decoded bytes consumed, for messages */
    uint64_t extents, populated;
    uint64_t span_lo, span_hi; /* extents seen since span_lo was set to UINT64_MAX: lowest start, */
                               /* highest end (the sequential decoder resets them per frame) */
    int fd;                    /* destination, -1 to discard */
    const char *name;
    const char *dst_name;
    char where[96]; /* "frame 3 at object offset 1234" */
};

void rec_init(struct rec_parser *rp, enum rec_state start, int fd, const char *name,
              uint64_t max_size);
int rec_feed(struct rec_parser *rp, const uint8_t *buf, size_t len, struct vmsnap_err *err);
/* True when the parser sits between records (a frame may end here). */
bool rec_at_boundary(const struct rec_parser *rp);

#endif
