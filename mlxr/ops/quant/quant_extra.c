/* CPU kernels for the extra block types kept quantized: GGUF's Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL,
 * IQ4_XS and bitsandbytes' NF4 (codes 6..12 of mlxr/ops/quant/block_types.py EXTRA_TYPES).
 *
 * Matmul: y[m][n] = sum_k x[m][k] * W[n][k] with fp32 activations. Each weight block is
 * dequantized once into a small fp32 buffer (it stays in L1) and dotted with every activation
 * row, so each weight byte is read from memory once per call: decode is bound by the quantized
 * bytes. The dot keeps 16 independent partial sums, which the compiler turns into vector FMAs
 * without reassociating anything itself.
 *
 * Dequantization is exact to gguf-py's numpy reference: the same fp32 operations in the same
 * order, built with -ffp-contract=off so no multiply-add is fused.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { T_Q4_1 = 6, T_Q5_1 = 7, T_Q2_K = 8, T_Q3_K = 9, T_IQ4_NL = 10, T_IQ4_XS = 11, T_NF4 = 12 };

static const int BLOCK_ELEMS[7] = {32, 32, 256, 256, 32, 256, 64};
static const int BLOCK_BYTES[7] = {20, 24, 84, 110, 18, 136, 36};
static const float NF4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                              -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                              0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                              0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                              0.7229568362236023f, 1.0f};
static const int8_t KVALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

#include "half.h" /* h2f: the blocks' fp16 scales */

/* Blocks of 32 from 16 bytes: the low nibbles are elements 0..15, the high ones 16..31. The
 * loops below are written per run of constant scale so that the compiler vectorizes them. */
static void q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 15) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

static void q5_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 15) | (((qh >> j) & 1) << 4)) + m;
        y[j + 16] = d * (float)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
    }
}

/* Q2_K and Q3_K's 2-bit codes: element i = 128 h + 32 t + l of 256 sits in byte 32 h + l at
 * shift 2 t; its scale is sub-block i / 16 = 8 h + 2 t + l / 16. */
static void q2_k(const uint8_t *b, float *y) {
    float d = h2f(b + 80), dmin = h2f(b + 82);
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int half = 0; half < 2; half++) {
                int s = 8 * h + 2 * t + half;
                float dl = d * (float)(b[s] & 15), ml = dmin * (float)(b[s] >> 4);
                const uint8_t *q = b + 16 + 32 * h + 16 * half;
                float *out = y + 128 * h + 32 * t + 16 * half;
                for (int l = 0; l < 16; l++) out[l] = dl * (float)((q[l] >> (2 * t)) & 3) - ml;
            }
}

static void q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *sc = b + 96;
    float d = h2f(b + 108);
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int half = 0; half < 2; half++) {
                int s = 8 * h + 2 * t + half, bit = 4 * h + t;
                int low = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
                int high = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
                float dl = d * (float)((low | (high << 4)) - 32);
                const uint8_t *q = b + 32 + 32 * h + 16 * half, *hm = hmask + 16 * half;
                float *out = y + 128 * h + 32 * t + 16 * half;
                for (int l = 0; l < 16; l++)
                    out[l] = dl * (float)(((q[l] >> (2 * t)) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4));
            }
}

static void iq4_nl(const uint8_t *b, float *y) {
    float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)KVALUES[qs[j] & 15];
        y[j + 16] = d * (float)KVALUES[qs[j] >> 4];
    }
}

static void iq4_xs(const uint8_t *b, float *y) {
    float d = h2f(b);
    int sh = b[2] | (b[3] << 8);
    for (int s = 0; s < 8; s++) {
        int low = (b[4 + s / 2] >> (4 * (s & 1))) & 15, high = (sh >> (2 * s)) & 3;
        float dl = d * (float)((low | (high << 4)) - 32);
        const uint8_t *qs = b + 8 + s * 16;
        for (int j = 0; j < 16; j++) {
            y[s * 32 + j] = dl * (float)KVALUES[qs[j] & 15];
            y[s * 32 + j + 16] = dl * (float)KVALUES[qs[j] >> 4];
        }
    }
}

static void nf4(const uint8_t *b, float *y) {
    float absmax;
    memcpy(&absmax, b, 4);
    for (int j = 0; j < 32; j++) {
        y[2 * j] = NF4[b[4 + j] >> 4] * absmax;
        y[2 * j + 1] = NF4[b[4 + j] & 15] * absmax;
    }
}

static void dequant_block(int t, const uint8_t *b, float *y) {
    switch (t) {
    case T_Q4_1: q4_1(b, y); break;
    case T_Q5_1: q5_1(b, y); break;
    case T_Q2_K: q2_k(b, y); break;
    case T_Q3_K: q3_k(b, y); break;
    case T_IQ4_NL: iq4_nl(b, y); break;
    case T_NF4: nf4(b, y); break;
    default: iq4_xs(b, y); break;
    }
}

static void dequant_row(int t, const uint8_t *row, int64_t k, float *y) {
    int be = BLOCK_ELEMS[t - 6], bb = BLOCK_BYTES[t - 6];
    for (int64_t j = 0; j < k / be; j++) dequant_block(t, row + j * bb, y + j * be);
}

int mlxr_extra_valid(int t) { return t >= T_Q4_1 && t <= T_NF4; }

void mlxr_extra_dequant_f32(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int nthreads) {
    int64_t row_bytes = k / BLOCK_ELEMS[t - 6] * BLOCK_BYTES[t - 6];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < n; r++) dequant_row(t, w + r * row_bytes, k, out + r * k);
}

void mlxr_extra_dequant_rows_f32(int t, const uint8_t *w, int64_t k, const int64_t *rows, int64_t nrows, float *out) {
    int64_t row_bytes = k / BLOCK_ELEMS[t - 6] * BLOCK_BYTES[t - 6];
    for (int64_t r = 0; r < nrows; r++) dequant_row(t, w + rows[r] * row_bytes, k, out + r * k);
}

static inline float dot(const float *a, const float *b, int len) {
    float lanes[16] = {0};
    for (int i = 0; i < len; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += lanes[l];
    return s;
}

void mlxr_extra_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                        int nthreads) {
    int be = BLOCK_ELEMS[t - 6], bb = BLOCK_BYTES[t - 6];
    int64_t nblk = k / be, row_bytes = nblk * bb;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < n; r++) {
        float buf[256];
        const uint8_t *row = w + r * row_bytes;
        for (int64_t i = 0; i < m; i++) y[i * n + r] = 0.0f;
        for (int64_t j = 0; j < nblk; j++) {
            if (j + 4 < nblk) __builtin_prefetch(row + (j + 4) * bb);
            dequant_block(t, row + j * bb, buf);
            for (int64_t i = 0; i < m; i++) y[i * n + r] += dot(buf, x + i * k + j * be, be);
        }
    }
}
