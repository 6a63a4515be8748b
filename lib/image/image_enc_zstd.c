/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One zstd frame of the encoder: the pinned parameters, the checksum the encoder computes
 * itself, and the stepped compression that a cancel stops between pieces.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
/* for ZSTD_c_stableInBuffer / ZSTD_c_stableOutBuffer: experimental names of parameters of the
 * stable ZSTD_CCtx_setParameter (since zstd 1.4.5), the buffer modes ZSTD_compress2 itself uses */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

/* The pinned parameters: the level, the content-size flag, no zstd threads, and for
 * levels up to 1 a 1 MiB window (zstd's own default there is 512 KiB; from level 2 it is 1 MiB
 * or more). The larger window made the 2 GiB bench image 0.17% smaller, smaller than zstd -1 -T0
 * of the whole file, at no measurable speed cost; a streaming decoder needs only that much
 * memory. zstd still shrinks the window for smaller frames. */
#define LOW_LEVEL_WINDOW_LOG 20

static int set_cparams(ZSTD_CCtx *cctx, int level)
{
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(r) && level <= 1)
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, LOW_LEVEL_WINDOW_LOG);
    if (!ZSTD_isError(r)) /* img_compress_frame appends the checksum itself */
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_nbWorkers, 0);
    return ZSTD_isError(r) ? -EINVAL : 0;
}

/* The buffer img_compress_frame needs for `len` bytes. */
static size_t frame_bound(size_t len)
{
    return ZSTD_compressBound(len) + 4;
}

/* The `n`-byte zstd frame at `out` gets the checksum flag and `checksum`'s low 32 bits. */
static int finish_frame(uint8_t *out, size_t n, uint64_t checksum, size_t *out_len,
                        struct vmsnap_err *err)
{
    if (n < 6 || get_le32(out) != ZSTD_MAGICNUMBER || out[4] & 0x04)
        return vmsnap_err_set(err, EIO, "zstd compress: unexpected frame header");
    out[4] |= 0x04;
    put_le32(out + n, (uint32_t)checksum);
    *out_len = n + 4;
    return 0;
}

/* At --level STEPPED_LEVEL and above a frame is compressed in COMPRESS_STEP pieces, so that the
 * encode stops between pieces when it is cancelled or aborted (a 64 MiB frame at --level 19 takes
 * half a minute; Ctrl-C waited for it, then the pack exited 0). Below, where a frame takes a
 * fraction of a second, ZSTD_compress2 takes it whole. */
#define COMPRESS_STEP ((size_t)4 << 20)
#define STEPPED_LEVEL 10

/* Compress `len` bytes into `out` (frame_bound(len) bytes) as a frame carrying
 * zstd's content checksum. `checksum` is the caller's XXH64 of `src` (seed 0), which is what zstd
 * would hash: zstd compresses without its own pass over the data, and the frame gets the checksum
 * flag (bit 2 of the frame header descriptor, right after the magic) and the hash's low 32 bits
 * after its last block, byte for byte the frame zstd itself would write. Stepped (see above),
 * the input goes to zstd in pieces of one stable buffer whose size grows, its size pledged up
 * front, and a cancel or the encoder's abort (`e`, NULL: none) stops it between pieces. zstd
 * before 1.5.4 refuses a stable buffer that grows ("Source buffer is wrong"): there every frame
 * is compressed whole. The stepped frame is the bytes ZSTD_compress2 makes with zstd 1.5.4 to
 * 1.5.6 (checked at levels 1-19); from 1.5.7 its block pre-splitter may cut the blocks of a
 * streamed frame differently, so high-level output can differ by zstd version (as FORMAT.md
 * allows: identical for a given libzstd, for any thread count). */
int img_compress_frame(const struct enc *e, ZSTD_CCtx *cctx, int level, const uint8_t *src,
                       size_t len, uint64_t checksum, uint8_t *out, size_t *out_len,
                       struct vmsnap_err *err)
{
    size_t r = 0;
    if (set_cparams(cctx, level) < 0)
        return vmsnap_err_set(err, EINVAL, "zstd: cannot set level %d", level);
    if (level < STEPPED_LEVEL || len <= COMPRESS_STEP || ZSTD_versionNumber() < 10504) {
        r = ZSTD_compress2(cctx, out, frame_bound(len) - 4, src, len);
        if (ZSTD_isError(r))
            return vmsnap_err_set(err, EIO, "zstd compress: %s", ZSTD_getErrorName(r));
        return finish_frame(out, r, checksum, out_len, err);
    }
    if (ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_stableInBuffer, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_stableOutBuffer, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setPledgedSrcSize(cctx, len)))
        return vmsnap_err_set(err, EINVAL, "zstd: cannot set stepped compression: %s",
                              ZSTD_getErrorName(r));
    ZSTD_outBuffer ob = {out, frame_bound(len) - 4, 0};
    ZSTD_inBuffer ib = {src, 0, 0};
    for (;;) {
        ib.size = len - ib.size > COMPRESS_STEP ? ib.size + COMPRESS_STEP : len;
        const bool last = ib.size == len;
        r = ZSTD_compressStream2(cctx, &ob, &ib, last ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(r))
            return vmsnap_err_set(err, EIO, "zstd compress: %s", ZSTD_getErrorName(r));
        if (last && r == 0)
            break;
        if (last) /* the bound leaves room for the whole frame: never reached */
            return vmsnap_err_set(err, EIO, "zstd compress: frame larger than its bound");
        if (cancel_pending() || (e && __atomic_load_n(&e->abort, __ATOMIC_ACQUIRE))) {
            int rc = cancel_check(err);
            return rc < 0 ? rc : vmsnap_err_set(err, ECANCELED, "encode stopped");
        }
    }
    return finish_frame(out, ob.pos, checksum, out_len, err);
}

/* Compress the records `len` bytes at `src` into slot buffer `c` (grown as needed, charged
 * for worker `gw`, see img_ebuf_reserve); with a budget, `c` then shrinks to the frame. */
int img_compress_into(const struct enc *e, ZSTD_CCtx *cctx, const uint8_t *src, size_t len,
                      uint64_t checksum, struct ebuf *c, size_t *out_len, struct worker *gw,
                      struct vmsnap_err *err)
{
    int rc = img_ebuf_reserve(e, c, frame_bound(len), gw, err);
    if (rc == 0)
        rc = img_compress_frame(e, cctx, e->level, src, len, checksum, c->p, out_len, err);
    if (rc == 0 && e->mem)
        img_ebuf_trim(e, c, *out_len);
    return rc;
}
