/* K/V cache rows in their stored formats -> float32 rows, for the tile loads of attention.c. A
 * row is one token's one KV head (d values). The packed formats are blocks of 32 values, each a
 * little-endian fp16 scale then its payload (mlxr/ops/attention/kv_quant.py): q8_0 and q4_0 as
 * GGML lays them out, fp8 as 32 e4m3 bytes. Each value is (its code as a float) x scale in fp32,
 * the torch reference's arithmetic, so a kernel over a packed cache computes the bits it
 * computes over the same blocks dequantized to a float32 cache. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "../quant/half.h"

enum { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2, KV_Q8_0 = 3, KV_Q4_0 = 4, KV_FP8 = 5 };

static float fp8_values[256]; /* e4m3 (no infinities; 0x7f / 0xff NaN) as floats */

/* Fill fp8_values; called before any parallel region (idempotent). */
static void fp8_table_init(void) {
    static int ready;
    if (ready) return;
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        float x = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
        if (e == 15 && m == 7) x = NAN;
        fp8_values[b] = b & 0x80 ? -x : x;
    }
    ready = 1;
}

static inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* One stored row at src -> d floats at dst. */
static void decode_row(int fmt, const uint8_t *src, int64_t d, float *dst) {
    switch (fmt) {
    case KV_BF16:
        for (int64_t i = 0; i < d; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf16_to_float(h);
        }
        break;
    case KV_F16: {
        int64_t i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= d; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 2 * i))));
#endif
        for (; i < d; i++) dst[i] = h2f(src + 2 * i);
        break;
    }
    case KV_Q8_0:
        for (int64_t b = 0; b < d / 32; b++) {
            const uint8_t *blk = src + 34 * b;
            const float s = h2f(blk);
            const int8_t *q = (const int8_t *)(blk + 2);
            for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)q[i] * s;
        }
        break;
    case KV_Q4_0:
        for (int64_t b = 0; b < d / 32; b++) {
            const uint8_t *blk = src + 18 * b;
            const float s = h2f(blk);
            for (int i = 0; i < 16; i++) {
                dst[32 * b + i] = (float)((blk[2 + i] & 15) - 8) * s;
                dst[32 * b + 16 + i] = (float)((blk[2 + i] >> 4) - 8) * s;
            }
        }
        break;
    case KV_FP8:
        for (int64_t b = 0; b < d / 32; b++) {
            const uint8_t *blk = src + 34 * b;
            const float s = h2f(blk);
            for (int i = 0; i < 32; i++) dst[32 * b + i] = fp8_values[blk[2 + i]] * s;
        }
        break;
    default: /* KV_F32 */
        memcpy(dst, src, sizeof(float) * (size_t)d);
    }
}
