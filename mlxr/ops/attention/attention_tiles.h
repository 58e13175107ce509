/* Flash-style attention tiles for attention.c: a block of R query rows (the query heads of one
 * KV head, for one token or several) meets the keys TK positions at a time, with an online
 * softmax, so no score matrix longer than a tile exists and each K/V tile, read once from the
 * paged cache, serves all R rows from L1/L2.
 *
 * Every row's arithmetic depends on its own query and visible range [lo, hi) alone, never on
 * the rows beside it or on how many there are: tiles start at absolute multiples of TK, running
 * state restarts at absolute multiples of PART and partitions are merged in order, a tile's
 * positions the row cannot see weigh exactly 0, and a tile the row sees nothing of leaves its
 * state untouched (alpha 1, weights 0). So a prompt's token gets the bits its decode step gets,
 * and a decode row split over threads by partition gets the bits of an unsplit one. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TK 64      /* key positions per tile */
#define PART 512   /* positions per partition: decode splits a sequence here, prefill merges here */
#ifndef ROWS
#define ROWS 128 /* query rows per prefill block (tokens x grouped heads): 128 beat 64 by ~6%, 32 lost ~20% */
#endif

typedef struct { /* the paged cache of one sequence's KV head */
    const uint8_t *kc, *vc; /* rows of rb bytes in format fmt (attention_rows.h) */
    const float *zero;      /* a row of d zeros standing in past the context */
    const int64_t *table;
    int64_t bs, kh, kvh, d, rb;
    float scale, softcap;
    int fmt;
} kv_view;

typedef struct { /* running softmax of R rows: max, sum of weights, unnormalised output */
    float *m, *l, *acc;
} soft_state;

typedef struct { /* per-thread scratch for a block of up to `rows` rows */
    float *q, *kt, *s, *alpha, *kbuf, *vbuf; /* kbuf, vbuf: a tile's K/V rows as floats (other formats) */
    const float **krow, **vrow;
    soft_state part, total;
} tile_scratch;

static inline const uint8_t *kv_row(const uint8_t *cache, const kv_view *v, int64_t p) {
    return cache + ((v->table[p / v->bs] * v->bs + p % v->bs) * v->kh + v->kvh) * v->rb;
}

static void state_reset(soft_state *st, int64_t r, int64_t d) {
    for (int64_t i = 0; i < r; i++) st->m[i] = -INFINITY, st->l[i] = 0.0f;
    memset(st->acc, 0, sizeof(float) * (size_t)(r * d));
}

#ifdef __AVX512F__
#include <immintrin.h>

/* e^x for x <= 0 (softmax after subtracting the max): 2^n * e^r, |r| <= ln2/2, by a degree-6
 * Taylor polynomial (relative error ~1e-7); libm's scalar expf was most of the old kernel's time. */
static inline __m512 exp_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f)); /* below: 0 after scaling, as expf */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    const float c[6] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    for (int i = 0; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[i]));
    return _mm512_scalef_ps(p, n);
}

/* 16 rows of 16 floats -> their transpose, in registers (unpack, 128-bit and lane shuffles). */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int b = 0; b < 4; b++) { /* u[4b + k], lane L: column 4L + k of rows 4b..4b+3 */
        u[4 * b] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44);
        u[4 * b + 1] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        u[4 * b + 2] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44);
        u[4 * b + 3] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
        __m512 v1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_f32x4(v0, v1, 0x88);
        r[4 + k] = _mm512_shuffle_f32x4(w0, w1, 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
        r[12 + k] = _mm512_shuffle_f32x4(w0, w1, 0xDD);
    }
}

/* K rows of the tile -> kt [d][TK] (d a multiple of 16). */
static void pack_keys(const float **krow, int64_t d, float *kt) {
    for (int64_t j0 = 0; j0 < TK; j0 += 16)
        for (int64_t c0 = 0; c0 < d; c0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(krow[j0 + i] + c0);
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(kt + (c0 + i) * TK + j0, r[i]);
        }
}

/* s[r][0..TK) = q[r] . k for n (1..4) rows: each score a chain of d FMAs in order of c. */
static inline __attribute__((always_inline)) void scores_rows(const float *q, int64_t d, const float *kt, float *s,
                                                              const int n) {
    __m512 a[4][4];
    for (int r = 0; r < n; r++)
        for (int v = 0; v < 4; v++) a[r][v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        __m512 k[4];
        for (int v = 0; v < 4; v++) k[v] = _mm512_loadu_ps(kt + c * TK + 16 * v);
        for (int r = 0; r < n; r++) {
            __m512 b = _mm512_set1_ps(q[r * d + c]);
            for (int v = 0; v < 4; v++) a[r][v] = _mm512_fmadd_ps(b, k[v], a[r][v]);
        }
    }
    for (int r = 0; r < n; r++)
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(s + r * TK + 16 * v, a[r][v]);
}

/* acc[r][dc..dc+16nv) = acc * alpha[r] + sum over the tile of p[r][j] * v_j, for n rows. */
static inline __attribute__((always_inline)) void values_rows(const float *p, const float **vrow, const float *alpha,
                                                              float *acc, int64_t d, int64_t dc, const int n,
                                                              const int nv) {
    __m512 o[4][4];
    for (int r = 0; r < n; r++)
        for (int v = 0; v < nv; v++)
            o[r][v] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * d + dc + 16 * v), _mm512_set1_ps(alpha[r]));
    for (int64_t j = 0; j < TK; j++) {
        __m512 x[4];
        for (int v = 0; v < nv; v++) x[v] = _mm512_loadu_ps(vrow[j] + dc + 16 * v);
        for (int r = 0; r < n; r++) {
            __m512 b = _mm512_set1_ps(p[r * TK + j]);
            for (int v = 0; v < nv; v++) o[r][v] = _mm512_fmadd_ps(b, x[v], o[r][v]);
        }
    }
    for (int r = 0; r < n; r++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(acc + r * d + dc + 16 * v, o[r][v]);
}

static void tile_scores(const float *q, int64_t r, int64_t d, const float *kt, float *s) {
    for (int64_t i = 0; i < r; i += 4) {
        const float *qi = q + i * d;
        float *si = s + i * TK;
        switch (r - i) {
        case 1: scores_rows(qi, d, kt, si, 1); break;
        case 2: scores_rows(qi, d, kt, si, 2); break;
        case 3: scores_rows(qi, d, kt, si, 3); break;
        default: scores_rows(qi, d, kt, si, 4);
        }
    }
}

#define VALUES_CASE(n)                                                                              \
    for (; dc + 64 <= d; dc += 64) values_rows(pi, vrow, ai, acci, d, dc, n, 4);                    \
    for (; dc < d; dc += 16) values_rows(pi, vrow, ai, acci, d, dc, n, 1);                          \
    break;

static void tile_values(const float *p, const float **vrow, const float *alpha, int64_t r, int64_t d, float *acc) {
    for (int64_t i = 0; i < r; i += 4) {
        const float *pi = p + i * TK, *ai = alpha + i;
        float *acci = acc + i * d;
        int64_t dc = 0;
        switch (r - i) {
        case 1: VALUES_CASE(1)
        case 2: VALUES_CASE(2)
        case 3: VALUES_CASE(3)
        default: VALUES_CASE(4)
        }
    }
}

/* Row s of TK scores -> weights e^(s - m_new) where visible (lanes j0..j1), 0 elsewhere; returns
 * their sum, m_new in *m. */
static float tile_weights(float *s, int64_t j0, int64_t j1, float *m) {
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    __mmask16 k[4];
    for (int v = 0; v < 4; v++) {
        int64_t a = j0 - 16 * v, b = j1 - 16 * v; /* visible lanes [a, b) of this vector */
        a = a < 0 ? 0 : a > 16 ? 16 : a;
        b = b < 0 ? 0 : b > 16 ? 16 : b;
        k[v] = (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
        mx = _mm512_mask_max_ps(mx, k[v], mx, _mm512_loadu_ps(s + 16 * v));
    }
    float top = _mm512_reduce_max_ps(mx);
    top = top > *m ? top : *m;
    __m512 t = _mm512_set1_ps(top);
    for (int v = 0; v < 4; v++) {
        __m512 e = _mm512_maskz_mov_ps(k[v], exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * v), t)));
        _mm512_storeu_ps(s + 16 * v, e);
        sum = _mm512_add_ps(sum, e);
    }
    *m = top;
    return _mm512_reduce_add_ps(sum);
}
#define SIMD_DIM(d) ((d) % 16 == 0)
#else
#define SIMD_DIM(d) 0
static void pack_keys(const float **krow, int64_t d, float *kt) { (void)krow, (void)d, (void)kt; }
static void tile_scores(const float *q, int64_t r, int64_t d, const float *kt, float *s) {
    (void)q, (void)r, (void)d, (void)kt, (void)s;
}
static void tile_values(const float *p, const float **vrow, const float *alpha, int64_t r, int64_t d, float *acc) {
    (void)p, (void)vrow, (void)alpha, (void)r, (void)d, (void)acc;
}
static float tile_weights(float *s, int64_t j0, int64_t j1, float *m) { return (void)s, (void)j0, (void)j1, (void)m, 0; }
#endif

/* Portable versions (any head dim, or no AVX-512): the same order of operations per element. */
static void scores_plain(const float *q, int64_t r, int64_t d, const float **krow, float *s) {
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < TK; j++) {
            float a = 0.0f;
            for (int64_t c = 0; c < d; c++) a += q[i * d + c] * krow[j][c];
            s[i * TK + j] = a;
        }
}

static void values_plain(const float *p, const float **vrow, const float *alpha, int64_t r, int64_t d, float *acc) {
    for (int64_t i = 0; i < r; i++) {
        float *o = acc + i * d;
        for (int64_t c = 0; c < d; c++) o[c] *= alpha[i];
        for (int64_t j = 0; j < TK; j++) {
            const float w = p[i * TK + j], *x = vrow[j];
            for (int64_t c = 0; c < d; c++) o[c] += w * x[c];
        }
    }
}

static float weights_plain(float *s, int64_t j0, int64_t j1, float *m) {
    float top = *m, sum = 0.0f;
    for (int64_t j = j0; j < j1; j++) top = s[j] > top ? s[j] : top;
    for (int64_t j = 0; j < TK; j++) sum += (s[j] = j >= j0 && j < j1 ? expf(s[j] - top) : 0.0f);
    *m = top;
    return sum;
}
