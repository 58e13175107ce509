/* Attention pieces for float32 on the CPU, one call per layer where torch needs 15-30 small
 * ops (each a microsecond or more of dispatch; a decode step runs them for every layer).
 *
 * Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim] for K and V; a
 * token's slot is block * block_size + offset. Same math as the torch reference in
 * mlxr/ops/attention/paged_attention.py and mlxr/ops/rotary/rotary.py, in fp32. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rotate ("rotate half" layout) one head of d values by the angle table c, s (d/2 each). */
static void rotate(const float *x, const float *c, const float *s, int64_t d, float *y) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        y[i] = a * c[i] - b * s[i];
        y[i + half] = b * c[i] + a * s[i];
    }
}

/* q, k, v: [T, heads, d] with heads contiguous and rows q_stride/k_stride/v_stride apart.
 * Rotates q into q_out ([T, H, d], contiguous) and k into its cache slot, copies v into its
 * slot. inv_freq NULL: no rotation (q_out untouched). */
void mlxr_rope_write_kv_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                            const float *v, int64_t v_stride, const int64_t *pos, const float *inv_freq,
                            int64_t t, int64_t h, int64_t kh, int64_t d, float *q_out, float *kc,
                            float *vc, const int64_t *slots) {
    float c[512], s[512]; /* d <= 1024, checked by the caller */
    for (int64_t i = 0; i < t; i++) {
        float *kslot = kc + slots[i] * kh * d, *vslot = vc + slots[i] * kh * d;
        memcpy(vslot, v + i * v_stride, sizeof(float) * (size_t)(kh * d));
        if (!inv_freq) {
            memcpy(kslot, k + i * k_stride, sizeof(float) * (size_t)(kh * d));
            continue;
        }
        for (int64_t j = 0; j < d / 2; j++) {
            float f = (float)pos[i] * inv_freq[j];
            c[j] = cosf(f);
            s[j] = sinf(f);
        }
        for (int64_t j = 0; j < h; j++) rotate(q + i * q_stride + j * d, c, s, d, q_out + (i * h + j) * d);
        for (int64_t j = 0; j < kh; j++) rotate(k + i * k_stride + j * d, c, s, d, kslot + j * d);
    }
}

static inline float dot(const float *a, const float *b, int64_t d) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < d; i++) acc += a[i] * b[i];
    return acc;
}

static inline const float *slot(const float *cache, const int64_t *table, int64_t p, int64_t bs, int64_t kh,
                                int64_t kvh, int64_t d) {
    return cache + ((table[p / bs] * bs + p % bs) * kh + kvh) * d;
}

#ifdef __AVX512F__
#include <immintrin.h>

/* e^x for x <= 0 (softmax after subtracting the max): 2^n * e^r, |r| <= ln2/2, by a degree-6
 * Taylor polynomial (relative error ~1e-7); libm's scalar expf was most of the kernel's time. */
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

static void softmax_row(float *row, int64_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, row + i));
    }
    __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(m, exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + i), top)));
        _mm512_mask_storeu_ps(row + i, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(row + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + i), inv));
    }
}
#else
static void softmax_row(float *row, int64_t n) {
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t i = 0; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    for (int64_t i = 0; i < n; i++) sum += (row[i] = expf(row[i] - mx));
    for (int64_t i = 0; i < n; i++) row[i] /= sum;
}
#endif

/* Softmax of each of the g rows of n scores in place. */
static void softmax_rows(float *sc, int64_t g, int64_t n) {
    for (int64_t j = 0; j < g; j++) softmax_row(sc + j * n, n);
}

#ifdef __AVX512F__
/* Head dims of nc * 16 floats: one head's q (or output) stays in nc registers while a chunk
 * of positions streams past, so each score is nc FMAs and one horizontal sum. Chunks of
 * CHUNK positions keep their K (or V) rows in L1 for all g heads. */
#define CHUNK 32
static inline __attribute__((always_inline)) void scores_simd(
    const float *q, const float *kc, const int64_t *table, int64_t first, int64_t len, int64_t g, int64_t kh,
    int64_t kvh, int64_t bs, float scale, float softcap, float *sc, const int nc) {
    const int64_t n = len - first, d = 16 * nc;
    for (int64_t p0 = first; p0 < len; p0 += CHUNK) {
        int64_t p1 = p0 + CHUNK < len ? p0 + CHUNK : len;
        for (int64_t j = 0; j < g; j++) {
            __m512 qv[16];
            for (int c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(q + j * d + 16 * c);
            for (int64_t p = p0; p < p1; p++) {
                const float *kp = slot(kc, table, p, bs, kh, kvh, d);
                __m512 a0 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kp)), a1 = _mm512_setzero_ps();
                for (int c = 1; c < nc; c++) {
                    if (c & 1) a1 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kp + 16 * c), a1);
                    else a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kp + 16 * c), a0);
                }
                float x = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) * scale;
                sc[j * n + p - first] = softcap > 0.0f ? tanhf(x / softcap) * softcap : x;
            }
        }
    }
}

static inline __attribute__((always_inline)) void values_simd(
    const float *vc, const int64_t *table, int64_t first, int64_t len, int64_t g, int64_t kh, int64_t kvh,
    int64_t bs, const float *sc, float *out, const int nc) {
    const int64_t n = len - first, d = 16 * nc;
    for (int64_t p0 = first; p0 < len; p0 += CHUNK) {
        int64_t p1 = p0 + CHUNK < len ? p0 + CHUNK : len;
        for (int64_t j = 0; j < g; j++) {
            __m512 o[16];
            for (int c = 0; c < nc; c++) o[c] = p0 == first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + j * d + 16 * c);
            for (int64_t p = p0; p < p1; p++) {
                const float *vp = slot(vc, table, p, bs, kh, kvh, d);
                __m512 w = _mm512_set1_ps(sc[j * n + p - first]);
                for (int c = 0; c < nc; c++) o[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp + 16 * c), o[c]);
            }
            for (int c = 0; c < nc; c++) _mm512_storeu_ps(out + j * d + 16 * c, o[c]);
        }
    }
}

static inline __attribute__((always_inline)) void group_simd(
    const float *q, const float *kc, const float *vc, const int64_t *table, int64_t first, int64_t len,
    int64_t g, int64_t kh, int64_t kvh, int64_t bs, float scale, float softcap, float *sc, float *out, const int nc) {
    scores_simd(q, kc, table, first, len, g, kh, kvh, bs, scale, softcap, sc, nc);
    softmax_rows(sc, g, len - first);
    values_simd(vc, table, first, len, g, kh, kvh, bs, sc, out, nc);
}
#endif

/* The g query heads sharing one KV head of one sequence, over context positions
 * [first, len): scores into sc (g rows of len), softmax, weighted sum of V into out. */
static void attend_group(const float *q, const float *kc, const float *vc, const int64_t *table,
                         int64_t first, int64_t len, int64_t g, int64_t kh, int64_t kvh, int64_t d,
                         int64_t bs, float scale, float softcap, float *sc, float *out) {
#ifdef __AVX512F__
    switch (d) { /* a literal register count per head dim keeps q and the outputs in registers */
    case 64: group_simd(q, kc, vc, table, first, len, g, kh, kvh, bs, scale, softcap, sc, out, 4); return;
    case 128: group_simd(q, kc, vc, table, first, len, g, kh, kvh, bs, scale, softcap, sc, out, 8); return;
    case 256: group_simd(q, kc, vc, table, first, len, g, kh, kvh, bs, scale, softcap, sc, out, 16); return;
    }
#endif
    int64_t n = len - first;
    for (int64_t p = first; p < len; p++) {
        const float *kp = slot(kc, table, p, bs, kh, kvh, d);
        for (int64_t j = 0; j < g; j++) {
            float x = dot(q + j * d, kp, d) * scale;
            sc[j * n + p - first] = softcap > 0.0f ? tanhf(x / softcap) * softcap : x;
        }
    }
    softmax_rows(sc, g, n);
    memset(out, 0, sizeof(float) * (size_t)(g * d));
    for (int64_t p = first; p < len; p++) {
        const float *vp = slot(vc, table, p, bs, kh, kvh, d);
        for (int64_t j = 0; j < g; j++) {
            float w = sc[j * n + p - first], *o = out + j * d;
#pragma omp simd
            for (int64_t i = 0; i < d; i++) o[i] += w * vp[i];
        }
    }
}

/* One new token per sequence: q [S, H, d] contiguous attends over its sequence's first
 * seq_lens[s] cached tokens (the last window of them if window > 0); out [S, H, d].
 * Returns -1 when scratch memory cannot be had. */
int mlxr_paged_decode_f32(const float *q, const float *kc, const float *vc, const int64_t *tables,
                          int64_t max_blocks, const int64_t *seq_lens, int64_t ns, int64_t h, int64_t kh,
                          int64_t d, int64_t bs, float scale, int64_t window, float softcap, float *out,
                          int nthreads) {
    int64_t g = h / kh, longest = 0, work = 0;
    for (int64_t s = 0; s < ns; s++) {
        longest = seq_lens[s] > longest ? seq_lens[s] : longest;
        work += seq_lens[s];
    }
    int failed = 0;
    /* a parallel region costs a few microseconds: only worth it for enough context */
#pragma omp parallel num_threads(nthreads) if (work * h * d > (1 << 18)) reduction(| : failed)
    {
        float *sc = (float *)malloc(sizeof(float) * (size_t)(g * (longest > 0 ? longest : 1)));
        if (!sc) failed = 1;
#pragma omp for schedule(dynamic)
        for (int64_t i = 0; i < ns * kh; i++) {
            int64_t s = i / kh, kvh = i % kh, len = seq_lens[s];
            int64_t first = window > 0 && len > window ? len - window : 0;
            if (sc)
                attend_group(q + (s * h + kvh * g) * d, kc, vc, tables + s * max_blocks, first, len, g, kh,
                             kvh, d, bs, scale, softcap, sc, out + (s * h + kvh * g) * d);
        }
        free(sc);
    }
    return failed ? -1 : 0;
}

/* A prompt's tokens (or several sequences' new tokens): q [T, H, d] contiguous, sequence s's
 * tokens at query_start[s]..query_start[s+1], its last one at position seq_lens[s] - 1. Each
 * token attends causally over its own sequence's cache (the last window positions if window >
 * 0), as the decode kernel does one token: a prompt and its decode steps share the arithmetic,
 * and no score past the diagonal is computed. Returns -1 when scratch memory cannot be had. */
int mlxr_paged_prefill_f32(const float *q, const float *kc, const float *vc, const int64_t *tables,
                           int64_t max_blocks, const int64_t *query_start, const int64_t *seq_lens, int64_t ns,
                           int64_t h, int64_t kh, int64_t d, int64_t bs, float scale, int64_t window,
                           float softcap, float *out, int nthreads) {
    const int64_t g = h / kh, tokens = query_start[ns];
    int64_t longest = 1;
    for (int64_t s = 0; s < ns; s++) longest = seq_lens[s] > longest ? seq_lens[s] : longest;
    int64_t *seq_of = (int64_t *)malloc(sizeof(int64_t) * (size_t)(tokens > 0 ? tokens : 1));
    if (!seq_of) return -1;
    for (int64_t s = 0; s < ns; s++)
        for (int64_t t = query_start[s]; t < query_start[s + 1]; t++) seq_of[t] = s;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (tokens * longest * h * d > (1 << 18)) reduction(| : failed)
    {
        float *sc = (float *)malloc(sizeof(float) * (size_t)(g * longest));
        if (!sc) failed = 1;
#pragma omp for schedule(dynamic, 4)
        for (int64_t i = 0; i < tokens * kh; i++) {
            const int64_t t = i / kh, kvh = i % kh, s = seq_of[t];
            const int64_t len = seq_lens[s] - (query_start[s + 1] - 1 - t);
            const int64_t first = window > 0 && len > window ? len - window : 0;
            if (sc)
                attend_group(q + (t * h + kvh * g) * d, kc, vc, tables + s * max_blocks, first, len, g, kh, kvh, d,
                             bs, scale, softcap, sc, out + (t * h + kvh * g) * d);
        }
        free(sc);
    }
    free(seq_of);
    return failed ? -1 : 0;
}
