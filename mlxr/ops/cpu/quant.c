/* CPU kernels for GGUF weights kept in their file block layout (see mlxr/ops/quant_types.py).
 *
 * Matmul: y[m][n] = sum_k x[m][k] * W[n][k]. Activations are quantized per 32 columns to
 * 16 bits held as two int8 parts, xq = 256*hi + lo with one fp32 unit dx per 32 (hi is x
 * rounded to int8 over the block's absmax, lo the rounded remainder). Int8 alone, as
 * llama.cpp does, costs about 1% of top-1 agreement on Gemma 3; the second part costs one
 * more vpdpbusd per 32 weights. Every weight type is read as unsigned codes u with
 * w = s*u - o per 32 (Q6_K: per 16) columns, so one integer dot product (AVX-512 VNNI
 * vpdpbusd: u8 x s8 -> s32) serves all types:
 *     sum w*x = dx * (s * sum(u*xq) - o * sum(xq)).
 * The per-32 sums of xq are computed once per activation row.
 *
 * Dequantization is exact to gguf-py's numpy reference: the same fp32 operations in the same
 * order, built with -ffp-contract=off so no multiply-add is fused.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#include <immintrin.h>
#define MLXR_VNNI 1
#endif

enum { T_Q4_0 = 0, T_Q5_0 = 1, T_Q8_0 = 2, T_Q4_K = 3, T_Q5_K = 4, T_Q6_K = 5 };

static const int BLOCK_ELEMS[6] = {32, 32, 32, 256, 256, 256};
static const int BLOCK_BYTES[6] = {18, 22, 34, 144, 176, 210};

static inline float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) {
        f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---------------------------------------------------------------- exact dequantization */

static void dequant_block(int t, const uint8_t *b, float *y) {
    switch (t) {
    case T_Q4_0: {
        float d = h2f(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((qs[j] >> 4) - 8);
        }
        break;
    }
    case T_Q5_0: {
        float d = h2f(b);
        uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
        break;
    }
    case T_Q8_0: {
        float d = h2f(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
        break;
    }
    case T_Q4_K:
    case T_Q5_K: {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *scales = b + 4;
        const uint8_t *qh = b + 16;
        const uint8_t *qs = t == T_Q4_K ? b + 16 : b + 48;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, scales, &sc, &m);
            float dj = d * (float)sc, mj = dmin * (float)m;
            const uint8_t *q = qs + 32 * (j / 2);
            int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) {
                int u = (q[l] >> shift) & 0xF;
                if (t == T_Q5_K) u |= ((qh[l] >> j) & 1) << 4;
                y[32 * j + l] = dj * (float)u - mj;
            }
        }
        break;
    }
    case T_Q6_K: {
        float d = h2f(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int g = 0; g < 16; g++) {
            float dg = d * (float)sc[g];
            for (int i = 0; i < 16; i++) {
                int e = 16 * g + i, h = e / 128, s = (e % 128) / 32, l = e % 32;
                const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                int lo = (ql[l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0xF;
                int u = lo | (((qh[l] >> (2 * s)) & 3) << 4);
                y[e] = dg * (float)(u - 32);
            }
        }
        break;
    }
    }
}

static void dequant_row(int t, const uint8_t *row, int64_t k, float *y) {
    int64_t nb = k / BLOCK_ELEMS[t];
    for (int64_t i = 0; i < nb; i++) dequant_block(t, row + i * BLOCK_BYTES[t], y + i * BLOCK_ELEMS[t]);
}

void mlxr_dequant_f32(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int nthreads) {
    int64_t rb = k / BLOCK_ELEMS[t] * BLOCK_BYTES[t];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < n; r++) dequant_row(t, w + r * rb, k, out + r * k);
}

void mlxr_dequant_rows_f32(int t, const uint8_t *w, int64_t k, const int64_t *rows, int64_t nrows, float *out) {
    int64_t rb = k / BLOCK_ELEMS[t] * BLOCK_BYTES[t];
    for (int64_t i = 0; i < nrows; i++) dequant_row(t, w + rows[i] * rb, k, out + i * k);
}

/* ---------------------------------------------------------------- activation quantization */

typedef struct {
    int8_t *q;      /* m * k: high int8 part */
    int8_t *q2;     /* m * k: low int8 part */
    float *d;       /* m * k/32 */
    int32_t *s16;   /* m * k/16: sums of q per 16 columns */
    float *a32;     /* m * k/32: d * (sum of q per 32 columns), for the weights' offsets */
    float *a16;     /* m * k/16: d * (sum of q per 16 columns) */
} acts_t;

static void quantize_acts(const float *x, int64_t m, int64_t k, acts_t *a) {
    int64_t nb = k / 32;
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * k + 32 * b;
            int8_t *qb = a->q + r * k + 32 * b, *qb2 = a->q2 + r * k + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            float d1 = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
            float d = d1 / 256.0f, id2 = amax > 0.0f ? 1.0f / d : 0.0f;
            a->d[r * nb + b] = d;
            int32_t s0 = 0, s1 = 0;
            for (int i = 0; i < 32; i++) {
                int hi = (int)nearbyintf(xb[i] * id);
                hi = hi > 127 ? 127 : (hi < -127 ? -127 : hi);
                int lo = (int)nearbyintf((xb[i] - (float)hi * d1) * id2);
                lo = lo > 127 ? 127 : (lo < -127 ? -127 : lo);
                qb[i] = (int8_t)hi;
                qb2[i] = (int8_t)lo;
                int v = 256 * hi + lo;
                if (i < 16) s0 += v; else s1 += v;
            }
            a->s16[r * 2 * nb + 2 * b] = s0;
            a->s16[r * 2 * nb + 2 * b + 1] = s1;
            a->a16[r * 2 * nb + 2 * b] = d * (float)s0;
            a->a16[r * 2 * nb + 2 * b + 1] = d * (float)s1;
            a->a32[r * nb + b] = d * (float)(s0 + s1);
        }
    }
}

/* ---------------------------------------------------------------- block headers */
#ifndef MLXR_VNNI

/* Scales and offsets of one block's 16-column groups: w = s[g]*u - o[g]. */
static inline int block_header(int t, const uint8_t *b, float *s, float *o) {
    switch (t) {
    case T_Q4_0: { float d = h2f(b); s[0] = s[1] = d; o[0] = o[1] = 8.0f * d; return 1; }
    case T_Q5_0: { float d = h2f(b); s[0] = s[1] = d; o[0] = o[1] = 16.0f * d; return 1; }
    case T_Q8_0: { float d = h2f(b); s[0] = s[1] = d; o[0] = o[1] = 128.0f * d; return 1; }
    case T_Q4_K:
    case T_Q5_K: {
        float d = h2f(b), dmin = h2f(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, b + 4, &sc, &m);
            s[2 * j] = s[2 * j + 1] = d * (float)sc;
            o[2 * j] = o[2 * j + 1] = dmin * (float)m;
        }
        return 8;
    }
    default: { /* Q6_K */
        float d = h2f(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int g = 0; g < 16; g++) { s[g] = d * (float)sc[g]; o[g] = 32.0f * s[g]; }
        return 8;
    }
    }
}
#endif

/* ---------------------------------------------------------------- unsigned codes per 32 columns */

#ifdef MLXR_VNNI
static inline __m256i nibbles(__m256i q, int high) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    return _mm256_and_si256(high ? _mm256_srli_epi16(q, 4) : q, low4);
}

static inline __m256i codes(int t, const uint8_t *b, int j) {
    switch (t) {
    case T_Q4_0: {
        __m128i q = _mm_loadu_si128((const __m128i *)(b + 2));
        __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
        return _mm256_set_m128i(hi, lo);
    }
    case T_Q5_0: {
        __m128i q = _mm_loadu_si128((const __m128i *)(b + 6));
        __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        return _mm256_or_si256(_mm256_set_m128i(hi, lo), _mm256_maskz_set1_epi8((__mmask32)qh, 16));
    }
    case T_Q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
    case T_Q4_K:
        return nibbles(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (j / 2))), j & 1);
    case T_Q5_K: {
        __m256i lo = nibbles(_mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (j / 2))), j & 1);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        __mmask32 bit = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << j)));
        return _mm256_or_si256(lo, _mm256_maskz_set1_epi8(bit, 16));
    }
    default: { /* Q6_K: j = 4*half + s */
        int h = j / 4, s = j % 4;
        __m256i lo = nibbles(_mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (s & 1))), s >> 1);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    }
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
static inline void codes_scalar(int t, const uint8_t *b, int j, uint8_t *u) {
    for (int l = 0; l < 32; l++) {
        int e, v;
        switch (t) {
        case T_Q4_0: v = l < 16 ? (b[2 + l] & 0xF) : (b[2 + l - 16] >> 4); break;
        case T_Q5_0: {
            uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
            v = (l < 16 ? (b[6 + l] & 0xF) : (b[6 + l - 16] >> 4)) | (((qh >> l) & 1) << 4);
            break;
        }
        case T_Q8_0: v = b[2 + l] ^ 0x80; break;
        case T_Q4_K: v = (b[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF; break;
        case T_Q5_K: v = ((b[48 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF) | (((b[16 + l] >> j) & 1) << 4); break;
        default:
            e = 32 * j + l;
            {
                int h = e / 128, s = (e % 128) / 32;
                v = ((b[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0xF) | (((b[128 + 32 * h + l] >> (2 * s)) & 3) << 4);
            }
        }
        u[l] = (uint8_t)v;
    }
}
#endif

/* ---------------------------------------------------------------- matmul */

#define ROW_TILE 4

#ifndef MLXR_VNNI
/* Rows [m0, m0+mr) of activations against one weight row (portable C). */
static inline __attribute__((always_inline)) void dot_rows(
    int t, const uint8_t *wrow, int64_t k, const acts_t *a, int64_t m0, int mr, float *out) {
    const int be = BLOCK_ELEMS[t], bb = BLOCK_BYTES[t];
    const int64_t nb = k / be, n32 = k / 32;
    float s[16], o[16], off[ROW_TILE] = {0}, accs[ROW_TILE] = {0};
    uint8_t u[32];
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t *blk = wrow + ib * bb;
        int subs = block_header(t, blk, s, o);
        for (int j = 0; j < subs; j++) {
            int64_t c = ib * (be / 32) + j; /* 32-column index in the row */
            codes_scalar(t, blk, j, u);
            for (int r = 0; r < mr; r++) {
                int64_t row = m0 + r;
                float dx = a->d[row * n32 + c];
                const int32_t *s16 = a->s16 + row * 2 * n32 + 2 * c;
                const int8_t *xq = a->q + row * k + 32 * c, *xq2 = a->q2 + row * k + 32 * c;
                int32_t p0 = 0, p1 = 0;
                for (int l = 0; l < 16; l++) p0 += (int32_t)u[l] * (256 * xq[l] + xq2[l]);
                for (int l = 16; l < 32; l++) p1 += (int32_t)u[l] * (256 * xq[l] + xq2[l]);
                off[r] += dx * (o[2 * j] * (float)s16[0] + o[2 * j + 1] * (float)s16[1]);
                accs[r] += dx * (s[2 * j] * (float)p0 + s[2 * j + 1] * (float)p1);
            }
        }
    }
    for (int r = 0; r < mr; r++) out[r] = accs[r] - off[r];
}
#else
static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The fp16 scales at the start of 8 consecutive blocks `bb` bytes apart. */
static inline __m256 first_halfs8(const uint8_t *b, int bb) {
    uint16_t h[8];
    for (int i = 0; i < 8; i++) memcpy(&h[i], b + i * bb, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

static inline __m256 lane(__m256 v, int i) { return _mm256_permutexvar_ps(_mm256_set1_epi32(i), v); }

static inline __m256 bytes8_ps(uint64_t v, int is_signed) {
    __m128i b = _mm_cvtsi64_si128((long long)v);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

/* Q4_K/Q5_K: the 8 six-bit scales and mins of a block, one byte each. */
static inline void kscales(const uint8_t *q, uint64_t *sc, uint64_t *mn) {
    uint32_t w[3];
    memcpy(w, q, 12);
    uint64_t sc_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    uint64_t mn_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    *sc = (w[0] & 0x3f3f3f3fu) | (sc_hi << 32);
    *mn = (w[1] & 0x3f3f3f3fu) | (mn_hi << 32);
}

/* sum(u * (256*hi + lo)) per 4 columns, as floats (exact: |sum| < 2^28 fits int32). */
static inline __m256 dot32(__m256i u, const acts_t *a, int64_t at) {
    __m256i hi = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)(a->q + at)));
    __m256i both = _mm256_dpbusd_epi32(_mm256_slli_epi32(hi, 8), u, _mm256_loadu_si256((const __m256i *)(a->q2 + at)));
    return _mm256_cvtepi32_ps(both);
}

/* Rows [m0, m0+mr) of activations against one weight row (AVX-512 VNNI). The combined
 * weight x activation scales of 8 sub-blocks are built as one vector per block group, and
 * each sub-block takes its lane with a permute instead of scalar multiplies. */
static inline __attribute__((always_inline)) void dot_rows(
    int t, const uint8_t *wrow, int64_t k, const acts_t *a, int64_t m0, int mr, float *out) {
    const int be = BLOCK_ELEMS[t], bb = BLOCK_BYTES[t];
    const int64_t nb = k / be, n32 = k / 32, n16 = k / 16;
    __m256 acc[ROW_TILE], offv[ROW_TILE], sv[ROW_TILE];
    float offs[ROW_TILE];
    for (int r = 0; r < ROW_TILE; r++) { acc[r] = offv[r] = _mm256_setzero_ps(); offs[r] = 0.0f; }
    if (be == 32) {
        const float ofs = t == T_Q4_0 ? 8.0f : (t == T_Q5_0 ? 16.0f : 128.0f);
        int64_t ib = 0;
        for (; ib + 8 <= nb; ib += 8) {
            const uint8_t *blk = wrow + ib * bb;
            __m256 dw = first_halfs8(blk, bb);
            for (int r = 0; r < mr; r++) {
                int64_t row = m0 + r;
                sv[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(a->d + row * n32 + ib));
                offv[r] = _mm256_fmadd_ps(dw, _mm256_loadu_ps(a->a32 + row * n32 + ib), offv[r]);
            }
            for (int j = 0; j < 8; j++) {
                __m256i uv = codes(t, blk + j * bb, 0);
                for (int r = 0; r < mr; r++)
                    acc[r] = _mm256_fmadd_ps(dot32(uv, a, (m0 + r) * k + 32 * (ib + j)), lane(sv[r], j), acc[r]);
            }
        }
        for (; ib < nb; ib++) {
            const uint8_t *blk = wrow + ib * bb;
            float d = f16(blk);
            __m256i uv = codes(t, blk, 0);
            for (int r = 0; r < mr; r++) {
                int64_t row = m0 + r;
                acc[r] = _mm256_fmadd_ps(dot32(uv, a, row * k + 32 * ib), _mm256_set1_ps(d * a->d[row * n32 + ib]), acc[r]);
                offs[r] += d * a->a32[row * n32 + ib];
            }
        }
        for (int r = 0; r < mr; r++) out[r] = hsum8(acc[r]) - ofs * (hsum8(offv[r]) + offs[r]);
    } else if (t == T_Q6_K) {
        const __m256i lo_pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), hi_pairs = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
        for (int64_t ib = 0; ib < nb; ib++) {
            const uint8_t *blk = wrow + ib * bb;
            __m256 d = _mm256_set1_ps(f16(blk + 208));
            uint64_t sc[2];
            memcpy(sc, blk + 192, 16);
            __m256 glo = _mm256_mul_ps(d, bytes8_ps(sc[0], 1)), ghi = _mm256_mul_ps(d, bytes8_ps(sc[1], 1));
            __m256 slo[ROW_TILE], shi[ROW_TILE];
            for (int r = 0; r < mr; r++) {
                int64_t row = m0 + r;
                __m256 dxv = _mm256_loadu_ps(a->d + row * n32 + 8 * ib);
                slo[r] = _mm256_mul_ps(glo, _mm256_permutexvar_ps(lo_pairs, dxv));
                shi[r] = _mm256_mul_ps(ghi, _mm256_permutexvar_ps(hi_pairs, dxv));
                offv[r] = _mm256_fmadd_ps(glo, _mm256_loadu_ps(a->a16 + row * n16 + 16 * ib), offv[r]);
                offv[r] = _mm256_fmadd_ps(ghi, _mm256_loadu_ps(a->a16 + row * n16 + 16 * ib + 8), offv[r]);
            }
            for (int j = 0; j < 8; j++) {
                __m256i uv = codes(t, blk, j);
                int g = 2 * (j & 3);
                __m256i idx = _mm256_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1);
                for (int r = 0; r < mr; r++) {
                    __m256 s = _mm256_permutexvar_ps(idx, j < 4 ? slo[r] : shi[r]);
                    acc[r] = _mm256_fmadd_ps(dot32(uv, a, (m0 + r) * k + 256 * ib + 32 * j), s, acc[r]);
                }
            }
        }
        for (int r = 0; r < mr; r++) out[r] = hsum8(acc[r]) - 32.0f * hsum8(offv[r]);
    } else { /* Q4_K, Q5_K */
        for (int64_t ib = 0; ib < nb; ib++) {
            const uint8_t *blk = wrow + ib * bb;
            uint64_t sc, mn;
            kscales(blk + 4, &sc, &mn);
            __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(f16(blk)), bytes8_ps(sc, 0));
            __m256 dmn = _mm256_mul_ps(_mm256_set1_ps(f16(blk + 2)), bytes8_ps(mn, 0));
            for (int r = 0; r < mr; r++) {
                int64_t row = m0 + r;
                sv[r] = _mm256_mul_ps(dsc, _mm256_loadu_ps(a->d + row * n32 + 8 * ib));
                offv[r] = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(a->a32 + row * n32 + 8 * ib), offv[r]);
            }
            for (int j = 0; j < 8; j++) {
                __m256i uv = codes(t, blk, j);
                for (int r = 0; r < mr; r++)
                    acc[r] = _mm256_fmadd_ps(dot32(uv, a, (m0 + r) * k + 256 * ib + 32 * j), lane(sv[r], j), acc[r]);
            }
        }
        for (int r = 0; r < mr; r++) out[r] = hsum8(acc[r]) - hsum8(offv[r]);
    }
}
#endif

static inline __attribute__((always_inline)) void matmul_typed(int t, const uint8_t *w, int64_t n, int64_t k, const acts_t *a, int64_t m, float *y, int nthreads) {
    int64_t rb = k / BLOCK_ELEMS[t] * BLOCK_BYTES[t];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t col = 0; col < n; col++) {
        float out[ROW_TILE];
        for (int64_t m0 = 0; m0 < m; m0 += ROW_TILE) {
            int mr = m - m0 < ROW_TILE ? (int)(m - m0) : ROW_TILE;
            /* A literal row count per call, so the row loops unroll and the accumulators
             * stay in registers (a runtime count spills them to the stack). */
            switch (mr) {
            case 1: dot_rows(t, w + col * rb, k, a, m0, 1, out); break;
            case 2: dot_rows(t, w + col * rb, k, a, m0, 2, out); break;
            case 3: dot_rows(t, w + col * rb, k, a, m0, 3, out); break;
            default: dot_rows(t, w + col * rb, k, a, m0, ROW_TILE, out); break;
            }
            for (int r = 0; r < mr; r++) y[(m0 + r) * n + col] = out[r];
        }
    }
}

/* One specialised copy per type, so the switches above fold away. */
#define TYPED(T) static void matmul_##T(const uint8_t *w, int64_t n, int64_t k, const acts_t *a, int64_t m, float *y, int th) { matmul_typed(T, w, n, k, a, m, y, th); }
TYPED(T_Q4_0)
TYPED(T_Q5_0)
TYPED(T_Q8_0)
TYPED(T_Q4_K)
TYPED(T_Q5_K)
TYPED(T_Q6_K)

int mlxr_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int nthreads) {
    if (t < 0 || t > 5 || k % BLOCK_ELEMS[t]) return -1;
    acts_t a;
    a.q = (int8_t *)malloc((size_t)(m * k));
    a.q2 = (int8_t *)malloc((size_t)(m * k));
    a.d = (float *)malloc(sizeof(float) * (size_t)(m * (k / 32)));
    a.s16 = (int32_t *)malloc(sizeof(int32_t) * (size_t)(m * (k / 16)));
    a.a32 = (float *)malloc(sizeof(float) * (size_t)(m * (k / 32)));
    a.a16 = (float *)malloc(sizeof(float) * (size_t)(m * (k / 16)));
    if (!a.q || !a.q2 || !a.d || !a.s16 || !a.a32 || !a.a16) {
        free(a.q); free(a.q2); free(a.d); free(a.s16); free(a.a32); free(a.a16);
        return -2;
    }
    quantize_acts(x, m, k, &a);
    switch (t) {
    case T_Q4_0: matmul_T_Q4_0(w, n, k, &a, m, y, nthreads); break;
    case T_Q5_0: matmul_T_Q5_0(w, n, k, &a, m, y, nthreads); break;
    case T_Q8_0: matmul_T_Q8_0(w, n, k, &a, m, y, nthreads); break;
    case T_Q4_K: matmul_T_Q4_K(w, n, k, &a, m, y, nthreads); break;
    case T_Q5_K: matmul_T_Q5_K(w, n, k, &a, m, y, nthreads); break;
    default: matmul_T_Q6_K(w, n, k, &a, m, y, nthreads); break;
    }
    free(a.q); free(a.q2); free(a.d); free(a.s16); free(a.a32); free(a.a16);
    return 0;
}

int mlxr_simd_level(void) {
#ifdef MLXR_VNNI
    return 1;
#else
    return 0;
#endif
}
