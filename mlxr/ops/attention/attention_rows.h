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

#ifdef __AVX512F__
/* 16 codes (int32 lanes) of a packed block -> floats x s, as decode_row's scalar lines. */
static inline __m512 fp8_lanes(__m512i x) {
    const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7f));
    const __m512 normal = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.0f / 512.0f)); /* m x 2^-9, exact */
    const __m512 v = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), normal, sub);
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

/* The packed formats, 32 values a block, 16 lanes at a time; 1 when fmt was decoded here. */
static int decode_row_simd(int fmt, const uint8_t *src, int64_t d, float *dst) {
    for (int64_t b = 0; b < d / 32; b++) {
        const uint8_t *blk = src + (fmt == KV_Q4_0 ? 18 : 34) * b;
        const __m512 s = _mm512_set1_ps(h2f(blk));
        __m512 lo, hi;
        if (fmt == KV_Q8_0) {
            lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
            hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
        } else if (fmt == KV_Q4_0) {
            const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))), eight = _mm512_set1_epi32(8);
            lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(x, _mm512_set1_epi32(15)), eight));
            hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(x, 4), eight));
        } else if (fmt == KV_FP8) {
            lo = fp8_lanes(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
            hi = fp8_lanes(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
        } else {
            return 0;
        }
        _mm512_storeu_ps(dst + 32 * b, _mm512_mul_ps(lo, s));
        _mm512_storeu_ps(dst + 32 * b + 16, _mm512_mul_ps(hi, s));
    }
    return 1;
}
#endif

/* One stored row at src -> d floats at dst. */
static void decode_row(int fmt, const uint8_t *src, int64_t d, float *dst) {
#ifdef __AVX512F__
    if (fmt >= KV_Q8_0 && decode_row_simd(fmt, src, d, dst)) return;
#endif
    switch (fmt) {
    case KV_BF16: {
        int64_t i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= d; i += 16) {
            const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 2 * i)));
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
        }
#endif
        for (; i < d; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf16_to_float(h);
        }
        break;
    }
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

/* float32 -> IEEE fp16 bits, round to nearest even (as torch and F16C convert). */
static inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal, steps of 2^-24 (x 2^24 is exact) */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    return (uint16_t)(sign | ((ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23)) >> 13));
}

/* float32 -> bfloat16 bits, round to nearest even (torch's conversion). */
static inline uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* float32 within +-448 -> float8 e4m3 bits, round to nearest even (torch's conversion). */
static inline uint8_t float_to_e4m3(float y) {
    uint32_t x;
    memcpy(&x, &y, 4);
    const uint32_t sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    float a;
    memcpy(&a, &ax, 4);
    if (a < 0.015625f) return (uint8_t)(sign | (uint32_t)nearbyintf(a * 512.0f)); /* subnormal: steps of 2^-9 */
    const uint32_t r = ax + 0x7ffffu + ((ax >> 20) & 1u);
    return (uint8_t)(sign | ((((r >> 23) - 120u) << 3) | ((r >> 20) & 7u)));
}

static inline void put_half(uint8_t *p, float f) {
    const uint16_t h = float_to_half(f);
    memcpy(p, &h, 2);
}

/* d floats at x -> one stored row at dst: kv_quant.py's quantize_rows, bit for bit. */
static void encode_row(int fmt, const float *x, int64_t d, uint8_t *dst) {
    switch (fmt) {
    case KV_BF16:
    case KV_F16:
        for (int64_t i = 0; i < d; i++) {
            const uint16_t h = fmt == KV_BF16 ? float_to_bf16(x[i]) : float_to_half(x[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    case KV_Q8_0:
    case KV_FP8:
        for (int64_t b = 0; b < d / 32; b++) {
            const float *xb = x + 32 * b;
            uint8_t *blk = dst + 34 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
            if (fmt == KV_Q8_0) {
                const float s = amax / 127.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
                put_half(blk, s);
                for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)roundf(xb[i] * inv);
            } else {
                put_half(blk, amax / 448.0f);
                const float s = h2f(blk), inv = s != 0.0f ? 1.0f / s : 0.0f;
                for (int i = 0; i < 32; i++) {
                    const float y = xb[i] * inv;
                    blk[2 + i] = float_to_e4m3(y > 448.0f ? 448.0f : y < -448.0f ? -448.0f : y);
                }
            }
        }
        break;
    case KV_Q4_0:
        for (int64_t b = 0; b < d / 32; b++) {
            const float *xb = x + 32 * b;
            uint8_t *blk = dst + 18 * b;
            float extreme = 0.0f, amax = 0.0f;
            for (int i = 0; i < 32; i++)
                if (fabsf(xb[i]) > amax) amax = fabsf(xb[i]), extreme = xb[i];
            const float s = extreme / -8.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
            put_half(blk, s);
            for (int i = 0; i < 16; i++) {
                float lo = truncf(xb[i] * inv + 8.5f), hi = truncf(xb[16 + i] * inv + 8.5f);
                lo = lo < 0.0f ? 0.0f : lo > 15.0f ? 15.0f : lo;
                hi = hi < 0.0f ? 0.0f : hi > 15.0f ? 15.0f : hi;
                blk[2 + i] = (uint8_t)((uint8_t)lo | ((uint8_t)hi << 4));
            }
        }
        break;
    default: /* KV_F32 */
        memcpy(dst, x, sizeof(float) * (size_t)d);
    }
}
