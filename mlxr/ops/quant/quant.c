/* CPU kernels for GGUF weights kept in their file block layout (see mlxr/ops/quant/block_types.py).
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
 * Speed (AVX-512 VNNI + GFNI build): on these CPUs vpdpbusd, FMAs, permutes and
 * gf2p8affine share two pipes, so the kernel is bound by how many of those a 256-column
 * group needs. Codes are unpacked with one gf2p8affine per vector (shift and mask in one
 * op) and arranged so every int32 lane stays in one sub-block across a group's four vectors
 * (activations are stored in that order, with their scales already in lane order): a group
 * costs each row 8 vpdpbusd and six ops to join hi and lo, convert and scale, not one FMA and
 * one permute per 32 columns. Rows are taken in tiles of up to 8 activation rows, so a group's
 * codes are unpacked once for all of them. That is the decode kernel; prompts of 32 rows and
 * more go by weight panels instead (quant_panel.h: lanes over activation rows, on AMX tiles
 * where present).
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
#include "pool.h"
#if defined(MLXR_PORTABLE) /* portable C where the target has SIMD (cpu_build's aarch64 "portable") */
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__GFNI__)
#include <immintrin.h>
#define MLXR_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define MLXR_AVX2 1 /* quant_generic.h's AVX2 kernel */
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define MLXR_NEON 1 /* quant_generic.h's sums in NEON (quant_neon.h) */
#ifdef __ARM_FEATURE_DOTPROD
#define MLXR_NEON_DOT 1
#endif
#endif

/* Q4_1 (6) follows the quant_extra.c numbering (block_types.py): its codes are Q4_0's, with a
 * per-block offset instead of the fixed 8. */
enum { T_Q4_0 = 0, T_Q5_0 = 1, T_Q8_0 = 2, T_Q4_K = 3, T_Q5_K = 4, T_Q6_K = 5, T_Q4_1 = 6, N_TYPES = 7 };

static const int BLOCK_ELEMS[N_TYPES] = {32, 32, 32, 256, 256, 256, 32};
static const int BLOCK_BYTES[N_TYPES] = {18, 22, 34, 144, 176, 210, 20};

#include "half.h" /* h2f: the blocks' fp16 scales */

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
    case T_Q4_1: { /* gguf-py: d * q + m */
        float d = h2f(b), m = h2f(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(qs[j] & 0xF) + m;
            y[j + 16] = d * (float)(qs[j] >> 4) + m;
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

#define ROW_TILE 8

/* Per calling thread, grow-only buffers for the quantized activations: a decode step's ~100
 * matmuls allocate nothing (their size is bounded by the engine's batch of tokens). */
static __thread struct { void *p; size_t cap; } scratch_slots[3];

static void *scratch(int slot, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (bytes > scratch_slots[slot].cap) {
        void *p = aligned_alloc(64, bytes);
        if (!p) return NULL;
        free(scratch_slots[slot].p);
        scratch_slots[slot].p = p;
        scratch_slots[slot].cap = bytes;
    }
    return scratch_slots[slot].p;
}

/* 32 activations to hi, lo with x ~ d * (256*hi + lo); returns d, the sums of 256*hi + lo over
 * columns 0-15 and 16-31 in s[0], s[1]. */
static inline float quant32(const float *x, int8_t *hi, int8_t *lo, int32_t *s) {
#ifdef MLXR_VNNI
    __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
#elif defined(MLXR_AVX2)
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m8 = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x), magnitude), _mm256_and_ps(_mm256_loadu_ps(x + 8), magnitude)),
                              _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 16), magnitude), _mm256_and_ps(_mm256_loadu_ps(x + 24), magnitude)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#else
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
#endif
    float d1 = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    float d = d1 / 256.0f, id2 = amax > 0.0f ? 1.0f / d : 0.0f;
#ifdef MLXR_VNNI
    /* the scalar arithmetic below, 16 lanes at once (round to nearest even, no FMA) */
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    __m512 vid = _mm512_set1_ps(id), vd1 = _mm512_set1_ps(d1), vid2 = _mm512_set1_ps(id2);
    for (int h = 0; h < 2; h++) {
        __m512 xv = h ? x1 : x0;
        __m512i q = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(xv, vid)), lim), nlim);
        __m512 rest = _mm512_sub_ps(xv, _mm512_mul_ps(_mm512_cvtepi32_ps(q), vd1));
        __m512i r = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(rest, vid2)), lim), nlim);
        _mm_storeu_si128((__m128i *)(hi + 16 * h), _mm512_cvtepi32_epi8(q));
        _mm_storeu_si128((__m128i *)(lo + 16 * h), _mm512_cvtepi32_epi8(r));
        s[h] = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(q, 8), r));
    }
#else
    s[0] = s[1] = 0;
    for (int i = 0; i < 32; i++) {
        int h = (int)nearbyintf(x[i] * id);
        h = h > 127 ? 127 : (h < -127 ? -127 : h);
        int l = (int)nearbyintf((x[i] - (float)h * d1) * id2);
        l = l > 127 ? 127 : (l < -127 ? -127 : l);
        hi[i] = (int8_t)h;
        lo[i] = (int8_t)l;
        s[i / 16] += 256 * h + l;
    }
#endif
    return d;
}

#ifdef MLXR_VNNI
/* Laid out for the kernel: rows in tiles of ROW_TILE (the last may be shorter, mr rows), k
 * padded with zeros to kp, a multiple of 256. Within a tile, per 256 columns, per row: 256
 * bytes of hi then 256 of lo, each as four 64-byte vectors where vector i holds columns
 * 32j + 8i .. 32j + 8i + 7 at bytes 8j.. (the order the kernel reads weight codes in); and
 * REC floats in the kernel's int32 lane order (lane l: sub-block l/2): d (16), zeros then d *
 * sum(xq) per 32 columns (8 + 8; for the weights' offsets), d * sum(xq) per 16 columns (16;
 * Q6_K). So one pointer walks each, every row's data sits at a constant offset, and the kernel
 * needs no permute per row. */
#define REC 48
typedef struct {
    int8_t *q;
    float *s;
    int64_t kp;
} acts_t;

static int64_t padded(int64_t k) { return (k + 255) / 256 * 256; }

static int acts_alloc(acts_t *a, int64_t m, int64_t k) {
    a->kp = padded(k);
    a->q = (int8_t *)scratch(0, (size_t)(2 * m * a->kp));
    a->s = (float *)scratch(1, sizeof(float) * (size_t)(m * a->kp / 256 * REC));
    return a->q && a->s ? 0 : -1;
}

/* A row's last group when it holds 1-4 blocks of 32 (k = 640: Gemma 3's hidden size) is
 * stored folded: its four vectors' low halves (the only lanes in use) packed two to a vector,
 * so the kernel runs 2 vpdpbusd a part for it, not 4 (half_group_rows). */
static int folded_tail(int64_t k) { return k % 256 && k % 256 <= 128; }

/* Byte offset of vector i of a group (see acts_t), folded or not. */
static int64_t vector_at(int i, int folded) { return folded ? 64 * (i >> 1) + 32 * (i & 1) : 64 * i; }

/* Row tile m0 of the activations into a's layout. */
static void quantize_tile(const float *x, int64_t m, int64_t k, acts_t *a, int64_t m0) {
    const int64_t kp = a->kp, mr = m - m0 < ROW_TILE ? m - m0 : ROW_TILE, tail = folded_tail(k) ? k / 256 : -1;
    int8_t *tq = a->q + 2 * m0 * kp;
    float *ts = a->s + m0 * kp / 256 * REC;
    memset(tq, 0, (size_t)(2 * mr * kp));
    memset(ts, 0, sizeof(float) * (size_t)(mr * kp / 256 * REC));
    for (int64_t r = 0; r < mr; r++) {
        for (int64_t b = 0; b < k / 32; b++) {
            int8_t hi[32], lo[32], *at = tq + (b / 8 * mr + r) * 512 + 8 * (b % 8);
            float *sc = ts + (b / 8 * mr + r) * REC;
            int32_t sums[2];
            float d = quant32(x + (m0 + r) * k + 32 * b, hi, lo, sums);
            for (int i = 0; i < 4; i++) {
                memcpy(at + vector_at(i, b / 8 == tail), hi + 8 * i, 8);
                memcpy(at + 256 + vector_at(i, b / 8 == tail), lo + 8 * i, 8);
            }
            const int j = b % 8;
            sc[2 * j] = sc[2 * j + 1] = d;
            sc[24 + j] = d * (float)(sums[0] + sums[1]);
            sc[32 + 2 * j] = d * (float)sums[0];
            sc[33 + 2 * j] = d * (float)sums[1];
        }
    }
}

/* Tiles over the threads when there are several: a prompt's 128 rows quantized on one
 * thread held a two-thread 128-row matmul back by 2-3% under OpenMP's default wait policy
 * (2048x5632 Q4_K: 5.93-6.00 ms against 5.77-5.78, medians of 30, AMD EPYC Zen 5); with
 * OMP_WAIT_POLICY=PASSIVE (`mlxr serve`) it is even (bench/probes/prefill_matmul.py). */
static void quantize_acts(const float *x, int64_t m, int64_t k, acts_t *a, int nthreads) {
    const int64_t tiles = (m + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (tiles > 1)
    for (int64_t i = 0; i < tiles; i++) quantize_tile(x, m, k, a, i * ROW_TILE);
}
#else
#include "quant_generic.h" /* portable C and AVX2 */
#endif

/* ---------------------------------------------------------------- matmul */

/* fn over [0, units) on nthreads: pool.h's helpers in chunks of `chunk` for decode-sized
 * matmuls (pool_for_rows(m)), else an even split over OpenMP's team. */
static void run_chunks(int nthreads, int64_t m, int64_t units, int64_t chunk, chunk_fn fn, void *ctx) {
    if (pool_for_rows(m)) {
        pool_run(nthreads, units, chunk, fn, ctx);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
        int64_t th = 0, nth = 1;
#ifdef _OPENMP
        th = omp_get_thread_num();
        nth = omp_get_num_threads();
#endif
        fn(ctx, units * th / nth, units * (th + 1) / nth);
    }
}

#ifdef MLXR_VNNI

/* A weight row is walked in groups of 256 columns: one K-quant block or eight 32-column
 * blocks, eight 32-column sub-blocks j either way. A group's codes are read as four 512-bit
 * vectors in which 64-bit lane j always holds 8 codes of sub-block j (vector i: its columns
 * 8i..8i+7; the activations are stored in the same order, see acts_t). So every int32 lane of
 * a vpdpbusd belongs to one sub-block in all four vectors: the group's four dot products
 * accumulate in one register, and one convert and one FMA with the 16 lanes' scales finish
 * the group. */

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m512i lanes16(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

/* Per 64-bit lane q, with a bit matrix m(q): gf2p8affine's output bit i is the parity of
 * (byte 7-i of the lane's matrix) & input byte, so one op moves and masks bits. */
#define AFFINE(x, m) _mm512_gf2p8affine_epi64_epi8((x), (m), 0)
static inline long long mat_nibble(int high) { return high ? 0x1020408000000000LL : 0x0102040800000000LL; }
static inline long long mat_bit_to4(int b) { return (1LL << b) << 24; }
static inline long long mat_bits_to45(int b) { return ((1LL << b) << 24) | ((1LL << (b + 1)) << 16); }

/* Lane q of a vector from a per-lane function of q. */
#define PER_LANE(f) _mm512_set_epi64(f(7), f(6), f(5), f(4), f(3), f(2), f(1), f(0))


/* Q4_K/Q5_K nibbles: lane q of vector i is the low (q even) or high nibble of qs' 64-bit word
 * 4*(q/2) + i (sub-block q = 2p + h is nibble h of the 32 bytes at 32p). */
static inline __m512i k_nibbles(__m512i qs0, __m512i qs1, int i) {
#define NIB_WORD(q) (4 * ((q) / 2) + i)
#define NIB_MAT(q) mat_nibble((q) & 1)
    return AFFINE(_mm512_permutex2var_epi64(qs0, PER_LANE(NIB_WORD), qs1), PER_LANE(NIB_MAT));
}

/* Q6_K: sub-block q = 4H + s; low 4 bits from ql byte 64H + 32(s&1) + l, nibble s/2; top 2 bits
 * from qh byte 32H + l, bits 2s and 2s+1. */
static inline __m512i q6_codes(__m512i ql0, __m512i ql1, const uint8_t *qh, int i) {
#define QL_WORD(q) (8 * ((q) / 4) + 4 * ((q) & 1) + i)
#define QL_MAT(q) mat_nibble(((q) & 3) >> 1)
#define QH_MAT(q) mat_bits_to45(2 * ((q) & 3))
    __m512i lo = AFFINE(_mm512_permutex2var_epi64(ql0, PER_LANE(QL_WORD), ql1), PER_LANE(QL_MAT));
    long long h0, h1; /* qh words i (lanes 0-3) and 4 + i (lanes 4-7) */
    memcpy(&h0, qh + 8 * i, 8);
    memcpy(&h1, qh + 32 + 8 * i, 8);
    __m512i hv = _mm512_mask_set1_epi64(_mm512_set1_epi64(h0), 0xF0, h1);
    return _mm512_or_si512(lo, AFFINE(hv, PER_LANE(QH_MAT)));
}

/* A group's 32-column blocks: b[j] is block j, or an all-zero block (zero scale) past the
 * row's end, so a row's last, partial group needs no copy. */
static const uint8_t ZERO_BLOCK[34];

static inline void group_blocks(const uint8_t *g, int bb, int nblk, const uint8_t *b[8]) {
    for (int j = 0; j < 8; j++) b[j] = j < nblk ? g + j * bb : ZERO_BLOCK;
}

/* 16 bytes at b[j] + off in 128-bit lane j - j0 (4 lanes). */
static inline __m512i four_x16(const uint8_t *const *b, int j0, int off) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b[j0] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b[j0 + 1] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b[j0 + 2] + off)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b[j0 + 3] + off)), 3);
}

/* 32 bytes at b[j] + 2 in the low half, b[j+1] + 2 in the high half. */
static inline __m512i two_x32(const uint8_t *const *b, int j) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b[j] + 2))), _mm256_loadu_si256((const __m256i *)(b[j + 1] + 2)), 1);
}

/* The 32-bit words at byte `at` of a group's (up to) 8 blocks, zeros past the row's end. */
static inline __m256i block_words(const uint8_t *g, int bb, int nblk, int at) {
    if (nblk < 8) { /* a gather can skip lanes; slower than scalar loads for a full group */
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bb));
        return _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), (__mmask8)((1u << nblk) - 1), idx, (const void *)(g + at), 1);
    }
    uint32_t w[8];
    for (int j = 0; j < 8; j++) memcpy(&w[j], g + j * bb + at, 4);
    return _mm256_loadu_si256((const __m256i *)w);
}

/* Q5_0: bit 8i + e of block q's 32-bit qh is the fifth bit of code byte e of lane q in vector i. */
static inline void q5_0_high(const uint8_t *g, int nblk, __m512i u[4]) {
    __m512i words = _mm512_cvtepu32_epi64(block_words(g, 22, nblk, 2));
    for (int i = 0; i < 4; i++) {
        const long long even = 0x0101010101010101LL * i, odd = 0x0101010101010101LL * (8 + i); /* byte i of the lane's word */
        __m512i byte_i = _mm512_shuffle_epi8(words, _mm512_set_epi64(odd, even, odd, even, odd, even, odd, even));
        __mmask64 set = _mm512_test_epi8_mask(byte_i, _mm512_set1_epi64(0x8040201008040201LL));
        u[i] = _mm512_mask_add_epi8(u[i], set, u[i], _mm512_set1_epi8(16));
    }
}

/* The unsigned codes of a group (nblk < 8: a 32-column type's partial last group), in the
 * order above. */
static inline __attribute__((always_inline)) void group_codes(int t, const uint8_t *g, int nblk, __m512i u[4]) {
    const uint8_t *b[8];
    if (BLOCK_ELEMS[t] == 32) group_blocks(g, BLOCK_BYTES[t], nblk, b);
    switch (t) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0: { /* vector i: nibble i/2 of each block's 64-bit word i%2 */
        const int qs = t == T_Q4_0 ? 2 : t == T_Q4_1 ? 4 : 6;
        __m512i lo4 = four_x16(b, 0, qs), hi4 = four_x16(b, 4, qs);
        __m512i w0 = _mm512_permutex2var_epi64(lo4, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), hi4);
        __m512i w1 = _mm512_permutex2var_epi64(lo4, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), hi4);
        const __m512i lo = _mm512_set1_epi64(mat_nibble(0)), hi = _mm512_set1_epi64(mat_nibble(1));
        u[0] = AFFINE(w0, lo), u[1] = AFFINE(w1, lo), u[2] = AFFINE(w0, hi), u[3] = AFFINE(w1, hi);
        if (t == T_Q5_0) q5_0_high(g, nblk, u);
        break;
    }
    case T_Q8_0: { /* vector i: each block's 64-bit word i, by a 4x8 transpose of 64-bit words */
        __m512i z0 = two_x32(b, 0), z1 = two_x32(b, 2), z2 = two_x32(b, 4), z3 = two_x32(b, 6);
        const __m512i even = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13), odd = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
        __m512i t0 = _mm512_permutex2var_epi64(z0, even, z1), t1 = _mm512_permutex2var_epi64(z0, odd, z1);
        __m512i t2 = _mm512_permutex2var_epi64(z2, even, z3), t3 = _mm512_permutex2var_epi64(z2, odd, z3);
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        u[0] = _mm512_xor_si512(_mm512_shuffle_i64x2(t0, t2, 0x44), flip);
        u[1] = _mm512_xor_si512(_mm512_shuffle_i64x2(t0, t2, 0xEE), flip);
        u[2] = _mm512_xor_si512(_mm512_shuffle_i64x2(t1, t3, 0x44), flip);
        u[3] = _mm512_xor_si512(_mm512_shuffle_i64x2(t1, t3, 0xEE), flip);
        break;
    }
    case T_Q4_K:
    case T_Q5_K: {
        const uint8_t *qs = g + (t == T_Q4_K ? 16 : 48);
        __m512i qs0 = _mm512_loadu_si512((const void *)qs), qs1 = _mm512_loadu_si512((const void *)(qs + 64));
        for (int i = 0; i < 4; i++) u[i] = k_nibbles(qs0, qs1, i);
        if (t == T_Q5_K) /* bit q of qh byte 8i + e */
            for (int i = 0; i < 4; i++)
                u[i] = _mm512_or_si512(u[i], AFFINE(_mm512_set1_epi64(*(const long long *)(g + 16 + 8 * i)), PER_LANE(mat_bit_to4)));
        break;
    }
    default: { /* Q6_K */
        __m512i ql0 = _mm512_loadu_si512((const void *)g), ql1 = _mm512_loadu_si512((const void *)(g + 64));
        for (int i = 0; i < 4; i++) u[i] = q6_codes(ql0, ql1, g + 128, i);
    }
    }
}

/* A 32-column type's lanes 0-7 the blocks' scales s, lanes 8-15 their offsets o (w = s*u - o):
 * Q4_1's o is its block's -m; the others' is s, scaled by 8, 16 or 128 at the end (dot_rows). */
static inline __m512 block_scales_offsets(int t, const uint8_t *g, int nblk) {
    __m256i words = block_words(g, BLOCK_BYTES[t], nblk, 0);
    __m256 d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(words));
    __m256 o = t == T_Q4_1 ? _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(words, 16)))) : d;
    return _mm512_insertf32x8(_mm512_castps256_ps512(d), o, 1);
}

/* Q4_K/Q5_K: lanes 0-7 the sub-block scales d*sc, lanes 8-15 the offsets dmin*mn, from the
 * 12 bytes of packed six-bit values (see scale_min_k4). */
static inline __m512 kscales(const uint8_t *b) {
    __m128i q = _mm_loadu_si128((const __m128i *)(b + 4)); /* 12 bytes and 4 of the codes */
    /* dwords sc0-3, sc4-7, mn0-3, mn4-7: low bits from bytes 0-3, 8-11 (low nibbles), 4-7, 8-11 (high) */
    __m128i lo = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    lo = _mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 0, 0, 4)), _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* top two bits of sc4-7 and mn4-7: bits 6-7 of bytes 0-3 and 4-7 */
    __m128i hi = _mm_shuffle_epi8(q, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    hi = _mm_and_si128(_mm_srli_epi32(hi, 2), _mm_set1_epi8(0x30));
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(lo, hi)));
    int32_t dd;
    memcpy(&dd, b, 4);
    __m512 scale = _mm512_permutexvar_ps(_mm512_srli_epi32(lanes16(), 3), _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(dd))));
    return _mm512_mul_ps(v, scale);
}

/* The multiple of a 32-column type's scale that its codes are offset by (w = s*(u - ofs)); 1
 * for the types whose offset is their own per block (Q4_1, the K-quants' mins). */
static inline float code_offset(int t) {
    return t == T_Q4_0 ? 8.0f : t == T_Q5_0 ? 16.0f : t == T_Q8_0 ? 128.0f : t == T_Q6_K ? 32.0f : 1.0f;
}

/* sum(u * (256*hi + lo)) per int32 lane over n code vectors (exact: < 2^31 for 4 vectors). */
static inline __m512 dot_group(const __m512i *u, const int8_t *q, int n) {
    __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
    for (int i = 0; i < n; i++) {
        h = _mm512_dpbusd_epi32(h, u[i], _mm512_load_si512((const void *)(q + 64 * i)));
        l = _mm512_dpbusd_epi32(l, u[i], _mm512_load_si512((const void *)(q + 256 + 64 * i)));
    }
    return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
}

/* One group against the tile's mr activation rows: q and sc point at the group's data. */
static inline __attribute__((always_inline)) void group_rows(
    int t, const uint8_t *g, int nblk, const int8_t *q, const float *sc, int mr, __m512 *acc) {
    __m512i u[4];
    group_codes(t, g, nblk, u);
    if (t == T_Q6_K) { /* scales per 16 columns: lane l's codes are in 16-column group l&~1 (vectors 0, 1) or l|1 */
        __m512 ws = _mm512_mul_ps(_mm512_set1_ps(f16(g + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 192)))));
        __m512 wa = _mm512_permutexvar_ps(_mm512_andnot_si512(_mm512_set1_epi32(1), lanes16()), ws);
        __m512 wb = _mm512_permutexvar_ps(_mm512_or_si512(_mm512_set1_epi32(1), lanes16()), ws);
        const __m512 wo = _mm512_mul_ps(ws, _mm512_set1_ps(-code_offset(t)));
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const float *rec = sc + REC * r;
            __m512 dx = _mm512_load_ps(rec);
            acc[r] = _mm512_fmadd_ps(wo, _mm512_load_ps(rec + 32), acc[r]);
            acc[r] = _mm512_fmadd_ps(dot_group(u, q + 512 * r, 2), _mm512_mul_ps(wa, dx), acc[r]);
            acc[r] = _mm512_fmadd_ps(dot_group(u + 2, q + 512 * r + 128, 2), _mm512_mul_ps(wb, dx), acc[r]);
        }
        return;
    }
    /* lanes 0-7 the weight scales s, lanes 8-15 the offsets o (32-column types: o = s, scaled
     * by 8, 16 or 128 at the end); times the record's d and d * sum(xq) */
    __m512 wso = t == T_Q4_K || t == T_Q5_K ? kscales(g) : block_scales_offsets(t, g, nblk);
    const __m512 ws = _mm512_permutexvar_ps(_mm512_srli_epi32(lanes16(), 1), wso), wo = _mm512_mul_ps(wso, _mm512_set1_ps(-code_offset(t)));
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        acc[r] = _mm512_fmadd_ps(wo, _mm512_load_ps(sc + REC * r + 16), acc[r]);
        acc[r] = _mm512_fmadd_ps(dot_group(u, q + 512 * r, 4), _mm512_mul_ps(ws, _mm512_load_ps(sc + REC * r)), acc[r]);
    }
}

/* group_rows for a 32-column type's folded last group of 1-4 blocks: codes folded as the
 * activations are (folded_tail), int32 lanes 8-15 then hold sub-blocks 0-3 again. */
static inline __attribute__((always_inline)) void half_group_rows(
    int t, const uint8_t *g, int nblk, const int8_t *q, const float *sc, int mr, __m512 *acc) {
    __m512i u[4], f[2];
    group_codes(t, g, nblk, u);
    f[0] = _mm512_inserti64x4(u[0], _mm512_castsi512_si256(u[1]), 1);
    f[1] = _mm512_inserti64x4(u[2], _mm512_castsi512_si256(u[3]), 1);
    __m512 wso = block_scales_offsets(t, g, nblk);
    const __m512i sub = _mm512_srli_epi32(_mm512_and_si512(lanes16(), _mm512_set1_epi32(7)), 1);
    const __m512 ws = _mm512_permutexvar_ps(sub, wso), wo = _mm512_mul_ps(wso, _mm512_set1_ps(-code_offset(t)));
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        /* lane 2j of the record's d is sub-block j's */
        __m512 dx = _mm512_permutexvar_ps(_mm512_slli_epi32(sub, 1), _mm512_load_ps(sc + REC * r));
        acc[r] = _mm512_fmadd_ps(wo, _mm512_load_ps(sc + REC * r + 16), acc[r]);
        __m512i h = _mm512_dpbusd_epi32(_mm512_setzero_si512(), f[0], _mm512_load_si512((const void *)(q + 512 * r)));
        h = _mm512_slli_epi32(_mm512_dpbusd_epi32(h, f[1], _mm512_load_si512((const void *)(q + 512 * r + 64))), 8);
        h = _mm512_dpbusd_epi32(h, f[0], _mm512_load_si512((const void *)(q + 512 * r + 256)));
        h = _mm512_dpbusd_epi32(h, f[1], _mm512_load_si512((const void *)(q + 512 * r + 320)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), _mm512_mul_ps(ws, dx), acc[r]);
    }
}

/* Rows [m0, m0+mr) of activations against one weight row over columns [k0, k1) (AVX-512
 * VNNI; k0 a multiple of 256, k1 too or k). */
static inline __attribute__((always_inline)) void dot_rows(
    int t, const uint8_t *wrow, int64_t k0, int64_t k1, const acts_t *a, int64_t m0, int mr, float *out) {
    const int bb = BLOCK_BYTES[t], per_group = BLOCK_ELEMS[t] == 32 ? 8 : 1;
    const int64_t nb = k1 / BLOCK_ELEMS[t];
    const int8_t *q = a->q + 2 * m0 * a->kp + 512 * mr * (k0 / 256);
    const float *sc = a->s + m0 * a->kp / 256 * REC + REC * mr * (k0 / 256);
    __m512 acc[ROW_TILE];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    int64_t ib = k0 / BLOCK_ELEMS[t];
    for (; ib + per_group <= nb; ib += per_group, q += 512 * mr, sc += REC * mr) group_rows(t, wrow + ib * bb, 8, q, sc, mr, acc);
    if (ib < nb && BLOCK_ELEMS[t] == 32 && folded_tail(k1)) /* stored folded by quantize_tile */
        half_group_rows(t, wrow + ib * bb, (int)(nb - ib), q, sc, mr, acc);
    else if (ib < nb)
        group_rows(t, wrow + ib * bb, (int)(nb - ib), q, sc, mr, acc);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

#include "quant_panel.h" /* prompts: weight panels on VNNI or AMX tiles */
#endif

/* Weight rows [c0, c1) of one type. Rows are taken in chunks of COL_CHUNK and columns in
 * slices of K_SLICE so that with several activation tiles (prefill) a tile's slice stays in
 * L1 (8 rows x 2048 columns: 40 KB of codes and scales) while the chunk's weight rows, in L2,
 * pass over it; weight row by weight row, or with whole rows of 5632 columns (TinyLlama's
 * down projection: 110 KB a tile), the tiles would evict each other (a 128-row matmul at
 * 2048x5632 ran at 55 GMAC/s a core, at 5632x2048 at 124). */
#define COL_CHUNK 32
#define K_SLICE 2048
/* Weight rows are requested about this many bytes ahead: with the hardware prefetcher alone
 * the single-row (decode) kernel read DRAM-resident Q4_K/Q8_0 weights at 35-43 GB/s, with
 * this at 40-60 GB/s (a decode step of TinyLlama Q4_K_M: 20.9 -> 18.5 ms; AMD EPYC, the
 * non-temporal hint). The hint is the build's (cpu_build.py picks it by vendor): on an Intel
 * Xeon with AMX the non-temporal one halved the rate (2 threads, Q8_0 8.9 GB/s against 17.2
 * with the L2 hint, 2). */
#define PREFETCH_BYTES 12288
#ifndef MLXR_PREFETCH_HINT
#define MLXR_PREFETCH_HINT 0
#endif
static inline void prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, MLXR_PREFETCH_HINT);
}
static inline __attribute__((always_inline)) void matmul_range(
    int t, const uint8_t *w, int64_t n, int64_t k, const acts_t *a, int64_t m, float *y, int64_t c0, int64_t c1) {
    int64_t rb = k / BLOCK_ELEMS[t] * BLOCK_BYTES[t], ahead = (PREFETCH_BYTES + rb - 1) / rb;
    for (int64_t cc = c0; cc < c1; cc += COL_CHUNK) {
        int64_t ce = cc + COL_CHUNK < c1 ? cc + COL_CHUNK : c1;
        for (int64_t k0 = 0; k0 < k; k0 += K_SLICE) {
            int64_t k1 = k - k0 > K_SLICE ? k0 + K_SLICE : k;
            for (int64_t m0 = 0; m0 < m; m0 += ROW_TILE) {
                int mr = m - m0 < ROW_TILE ? (int)(m - m0) : ROW_TILE;
                for (int64_t col = cc; col < ce; col++) {
                    float out[ROW_TILE];
                    if (m0 == 0 && k0 == 0 && col + ahead < c1) prefetch(w + (col + ahead) * rb, rb);
                    /* A literal row count per call, so the row loops unroll and the accumulators
                     * stay in registers (a runtime count spills them to the stack). */
                    switch (mr) {
                    case 1: dot_rows(t, w + col * rb, k0, k1, a, m0, 1, out); break;
                    case 2: dot_rows(t, w + col * rb, k0, k1, a, m0, 2, out); break;
                    case 3: dot_rows(t, w + col * rb, k0, k1, a, m0, 3, out); break;
                    case 4: dot_rows(t, w + col * rb, k0, k1, a, m0, 4, out); break;
                    case 5: dot_rows(t, w + col * rb, k0, k1, a, m0, 5, out); break;
                    case 6: dot_rows(t, w + col * rb, k0, k1, a, m0, 6, out); break;
                    case 7: dot_rows(t, w + col * rb, k0, k1, a, m0, 7, out); break;
                    default: dot_rows(t, w + col * rb, k0, k1, a, m0, ROW_TILE, out); break;
                    }
                    float *dst = y + m0 * n + col;
                    for (int r = 0; r < mr; r++) dst[r * n] = k0 ? dst[r * n] + out[r] : out[r];
                }
            }
        }
    }
}

typedef void (*range_fn)(const uint8_t *, int64_t, int64_t, const acts_t *, int64_t, float *, int64_t, int64_t);

/* One specialised copy per type, so the type switches fold away (the OpenMP region below
 * is outlined once, so it must not be where the type becomes a constant). */
#define TYPED(T) \
    static void range_##T(const uint8_t *w, int64_t n, int64_t k, const acts_t *a, int64_t m, float *y, int64_t c0, int64_t c1) { \
        matmul_range(T, w, n, k, a, m, y, c0, c1); \
    }
TYPED(T_Q4_0)
TYPED(T_Q5_0)
TYPED(T_Q8_0)
TYPED(T_Q4_K)
TYPED(T_Q5_K)
TYPED(T_Q6_K)
TYPED(T_Q4_1)

static const range_fn RANGES[N_TYPES] = {range_T_Q4_0, range_T_Q5_0, range_T_Q8_0, range_T_Q4_K, range_T_Q5_K, range_T_Q6_K, range_T_Q4_1};

typedef struct {
    range_fn f;
    const uint8_t *w;
    int64_t n, k, m;
    const acts_t *a;
    float *y;
} matmul_job;

static void matmul_chunk(void *ctx, int64_t c0, int64_t c1) {
    const matmul_job *j = (const matmul_job *)ctx;
    j->f(j->w, j->n, j->k, j->a, j->m, j->y, c0, c1);
}

/* Weight rows in chunks of whole COL_CHUNKs, ~16 a thread, so a thread that is descheduled
 * mid-job holds up little (pool.h). */
static void matmul(int t, const uint8_t *w, int64_t n, int64_t k, const acts_t *a, int64_t m, float *y, int nthreads) {
    matmul_job job = {RANGES[t], w, n, k, m, a, y};
    int64_t chunk = n / (16 * (int64_t)(nthreads > 0 ? nthreads : 1));
    chunk = chunk < COL_CHUNK ? COL_CHUNK : (chunk + COL_CHUNK - 1) / COL_CHUNK * COL_CHUNK;
    run_chunks(nthreads, m, n, chunk, matmul_chunk, &job);
}

int mlxr_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int nthreads) {
    if (t < 0 || t >= N_TYPES || k % BLOCK_ELEMS[t]) return -1;
#ifdef MLXR_VNNI
    if (panel_qmatmul(t, w, n, k, x, m, y, nthreads) == 0) return 0;
#endif
    acts_t a;
    if (acts_alloc(&a, m, k)) return -2;
    quantize_acts(x, m, k, &a, nthreads);
    matmul(t, w, n, k, &a, m, y, nthreads);
    return 0;
}

/* 1 when prompts of mlxr_amx_min_rows rows or more run on AMX tiles (built for them, granted by the
 * kernel, MLXR_AMX not 0), else 0. */
int mlxr_amx(void) {
#ifdef MLXR_AMX
    return amx_enabled();
#else
    return 0;
#endif
}

/* The fewest activation rows that type t's matmuls take to AMX tiles; 0 in a build without them. */
int mlxr_amx_min_rows(int t) {
#ifdef MLXR_AMX
    return amx_min_rows(t);
#else
    (void)t;
    return 0;
#endif
}

/* The fewest activation rows that take type t's matmuls to weight panels (AMX tiles or VNNI);
 * 0 when none do (a build without VNNI, MLXR_VNNI_PANELS=0 without AMX). */
int mlxr_panel_min_rows(int t) {
#ifdef MLXR_VNNI
    return panel_min_rows(t);
#else
    (void)t;
    return 0;
#endif
}

/* 1 when a matmul of m activation rows runs on pool.h's helpers, 0 on OpenMP's team. */
int mlxr_pool_rows(int64_t m) { return pool_for_rows(m); }

/* How many times a pool helper stopped spinning because it was preempted (pool.h). */
int64_t mlxr_pool_backoffs(void) { return __atomic_load_n(&pool_backoffs, __ATOMIC_RELAXED); }

/* 2: AVX-512 VNNI + GFNI, 1: AVX2, 3: NEON, 4: NEON with sdot, 0: portable C. */
int mlxr_simd_level(void) {
#if defined(MLXR_VNNI)
    return 2;
#elif defined(MLXR_AVX2)
    return 1;
#elif defined(MLXR_NEON_DOT)
    return 4;
#elif defined(MLXR_NEON)
    return 3;
#else
    return 0;
#endif
}
