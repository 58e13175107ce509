/* The gated delta rule and its short causal convolution on the CPU, fp32 (the math of
 * delta_rule.py, whose docstrings hold the recurrence).
 *
 * Layout: q and k come with Hk heads, v, g, beta and the state with Hv (value head h reads key
 * head h / (Hv / Hk)); a token's heads are back to back, tokens `*_stride` floats apart (the
 * convolution's output split into q, k and v as views). The states live in the engine's pools
 * and are updated in place: row b of a decode step owns pool slot slots[b].
 *
 * Threads: one (row, head) or one head per task, OpenMP over them (torch's pool; see cpu_build.py). */
/* Contracted multiply-adds (FMA) here: the build turns them off for the kernels whose results must match
 * torch bit for bit; these are held to the fp32 reference within a tolerance instead. */
#pragma GCC optimize("fp-contract=fast")
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 64
#define MAX_DIM 512 /* per-thread scratch of a head's rows; the launcher checks the head dims */

static void unit_scaled(const float *x, int64_t n, float scale, float *out) {
    float sum = 0.f;
    for (int64_t i = 0; i < n; i++)
        sum += x[i] * x[i];
    float r = scale / sqrtf(sum + 1e-6f);
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * r;
}

/* One token into one head's state s [dk, dv]: decay, delta write, then o = s^T q. A fresh row
 * (its first token) starts from zeros and never reads s: a graph's padding rows share one slot. */
static void step_head(const float *q, const float *k, const float *v, float g, float beta, float *s,
                      float *o, int64_t dk, int64_t dv, int fresh) {
    float qn[MAX_DIM], kn[MAX_DIM], w[MAX_DIM];
    unit_scaled(q, dk, 1.f / sqrtf((float)dk), qn);
    unit_scaled(k, dk, 1.f, kn);
    float a = fresh ? 0.f : expf(g);
    for (int64_t j = 0; j < dv; j++)
        w[j] = 0.f;
    for (int64_t i = 0; i < dk && !fresh; i++) {
        const float *row = s + i * dv;
        for (int64_t j = 0; j < dv; j++)
            w[j] += row[j] * kn[i];
    }
    for (int64_t j = 0; j < dv; j++) {
        w[j] = beta * (v[j] - a * w[j]);
        o[j] = 0.f;
    }
    for (int64_t i = 0; i < dk; i++) {
        float *row = s + i * dv;
        for (int64_t j = 0; j < dv; j++) {
            row[j] = (fresh ? 0.f : a * row[j]) + kn[i] * w[j];
            o[j] += row[j] * qn[i];
        }
    }
}

/* One token for each of b rows: q, k [b, hk, dk], v [b, hv, dv], g, beta [b, hv] contiguous,
 * pool [slots, hv, dk, dv], out [b, hv, dv]. seq_lens [b] (or NULL): a row of context length 1
 * starts from a zero state, whatever its slot held. */
void mlxr_delta_step_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                         int64_t v_stride, const float *g, const float *beta, float *pool, const int64_t *slots,
                         const int64_t *seq_lens, float *out, int64_t b, int64_t hk, int64_t hv, int64_t dk,
                         int64_t dv, int threads) {
    int64_t group = hv / hk;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < b * hv; task++) {
        int64_t r = task / hv, h = task % hv;
        float *s = pool + (slots[r] * hv + h) * dk * dv;
        step_head(q + r * q_stride + (h / group) * dk, k + r * k_stride + (h / group) * dk,
                  v + r * v_stride + h * dv, g[task], beta[task], s, out + task * dv, dk, dv,
                  seq_lens && seq_lens[r] == 1);
    }
}

/* A chunk of n <= CHUNK tokens of one head through its state s [dk, dv] (delta_rule._chunk). */
typedef struct {
    float *q, *k, *kt, *w; /* [CHUNK, dk], [CHUNK, dk], k transposed [dk, CHUNK], [CHUNK, dv] */
    float c[CHUNK], b[CHUNK], kk[CHUNK][CHUNK], qk[CHUNK][CHUNK];
} chunk_scratch;

#define Q(i) (cs->q + (i) * dk)
#define K(i) (cs->k + (i) * dk)
#define KT(d) (cs->kt + (d) * CHUNK)
#define W(i) (cs->w + (i) * dv)

/* GCC's vector extension (SSE/AVX/NEON, whatever the build targets; scalar code where none):
 * 8 floats, loads and stores at any float's alignment. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
#define V8(p) (*(v8 *)(p))

/* c[m, n] += a[m, kd] @ b[kd, n], row-major with leading dims: 4 rows x 16 columns of c a pass in
 * registers, so each row of b read feeds 8 multiply-adds a load. */
static void gemm_acc(int64_t m, int64_t n, int64_t kd, const float *a, int64_t lda, const float *b, int64_t ldb,
                     float *c, int64_t ldc) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            float *c0 = c + i * ldc + j, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
            v8 x00 = V8(c0), x01 = V8(c0 + 8), x10 = V8(c1), x11 = V8(c1 + 8);
            v8 x20 = V8(c2), x21 = V8(c2 + 8), x30 = V8(c3), x31 = V8(c3 + 8);
            const float *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            for (int64_t d = 0; d < kd; d++) {
                v8 b0 = V8(b + d * ldb + j), b1 = V8(b + d * ldb + j + 8);
                x00 += a0[d] * b0, x01 += a0[d] * b1, x10 += a1[d] * b0, x11 += a1[d] * b1;
                x20 += a2[d] * b0, x21 += a2[d] * b1, x30 += a3[d] * b0, x31 += a3[d] * b1;
            }
            V8(c0) = x00, V8(c0 + 8) = x01, V8(c1) = x10, V8(c1 + 8) = x11;
            V8(c2) = x20, V8(c2 + 8) = x21, V8(c3) = x30, V8(c3 + 8) = x31;
        }
        for (; i < m; i++) {
            float *c0 = c + i * ldc + j;
            v8 x0 = V8(c0), x1 = V8(c0 + 8);
            for (int64_t d = 0; d < kd; d++)
                x0 += a[i * lda + d] * V8(b + d * ldb + j), x1 += a[i * lda + d] * V8(b + d * ldb + j + 8);
            V8(c0) = x0, V8(c0 + 8) = x1;
        }
    }
    for (; j < n; j++) /* the columns past the last 16 */
        for (int64_t i = 0; i < m; i++) {
            float acc = c[i * ldc + j];
            for (int64_t d = 0; d < kd; d++)
                acc += a[i * lda + d] * b[d * ldb + j];
            c[i * ldc + j] = acc;
        }
}

static void chunk_load(chunk_scratch *cs, const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                       const float *g, const float *beta, int64_t hv, int64_t n, int64_t dk) {
    float scale = 1.f / sqrtf((float)dk), run = 0.f;
    for (int64_t t = 0; t < n; t++) {
        unit_scaled(q + t * q_stride, dk, scale, Q(t));
        unit_scaled(k + t * k_stride, dk, 1.f, K(t));
        run += g[t * hv];
        cs->c[t] = run;
        cs->b[t] = beta[t * hv];
    }
    memset(cs->kt, 0, sizeof(float) * dk * CHUNK);
    for (int64_t t = 0; t < n; t++)
        for (int64_t d = 0; d < dk; d++)
            KT(d)[t] = K(t)[d];
    /* k_i.k_j and q_i.k_j for every j of the chunk, then decayed: kk strictly below the diagonal
     * (times b_i), qk on and below it; zeros elsewhere, so that qk is a whole matrix product's. */
    memset(cs->kk, 0, sizeof(cs->kk));
    memset(cs->qk, 0, sizeof(cs->qk));
    gemm_acc(n, CHUNK, dk, cs->k, dk, cs->kt, CHUNK, &cs->kk[0][0], CHUNK);
    gemm_acc(n, CHUNK, dk, cs->q, dk, cs->kt, CHUNK, &cs->qk[0][0], CHUNK);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < CHUNK; j++) {
            float decay = j <= i ? expf(cs->c[i] - cs->c[j]) : 0.f;
            cs->kk[i][j] *= j < i ? decay * cs->b[i] : 0.f;
            cs->qk[i][j] *= decay;
        }
}

static void chunk_head(chunk_scratch *cs, const float *v, int64_t v_stride, float *s, float *o, int64_t o_stride,
                       int64_t n, int64_t dk, int64_t dv) {
    /* W_i = b_i (v_i - exp(c_i) k_i^T S) - sum_{j<i} kk_ij W_j, in token order (the unit-triangular solve);
     * o_i = exp(c_i) q_i^T S + sum_{j<=i} qk_ij W_j, both reading the entering state. */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < dv; j++)
            W(i)[j] = o[i * o_stride + j] = 0.f;
    gemm_acc(n, dv, dk, cs->k, dk, s, dv, cs->w, dv);
    gemm_acc(n, dv, dk, cs->q, dk, s, dv, o, o_stride);
    for (int64_t i = 0; i < n; i++) {
        float *w = W(i), *oi = o + i * o_stride, ec = expf(cs->c[i]);
        const float *vi = v + i * v_stride;
        for (int64_t j = 0; j < dv; j++) {
            w[j] = cs->b[i] * (vi[j] - ec * w[j]);
            oi[j] *= ec;
        }
        for (int64_t m = 0; m < i; m++) {
            const float *wm = W(m);
            float a = cs->kk[i][m];
            for (int64_t j = 0; j < dv; j++)
                w[j] -= a * wm[j];
        }
    }
    gemm_acc(n, dv, n, &cs->qk[0][0], CHUNK, cs->w, dv, o, o_stride);
    /* S = exp(c_last) S + sum_m exp(c_last - c_m) k_m W_m^T: k transposed, scaled in place (its last use) */
    float last = cs->c[n - 1], tail[CHUNK], el = expf(last);
    for (int64_t m = 0; m < n; m++)
        tail[m] = expf(last - cs->c[m]);
    for (int64_t d = 0; d < dk; d++) {
        float *row = s + d * dv, *col = KT(d);
        for (int64_t j = 0; j < dv; j++)
            row[j] *= el;
        for (int64_t m = 0; m < n; m++)
            col[m] *= tail[m];
    }
    gemm_acc(dk, dv, n, cs->kt, CHUNK, cs->w, dv, s, dv);
}

/* One sequence of t tokens: q, k [t, hk, dk], v [t, hv, dv], g, beta [t, hv] contiguous, state
 * [hv, dk, dv] (in place), out [t, hv, dv]. Chunks of CHUNK tokens, each head a task. Returns
 * nonzero when a thread's scratch could not be allocated. */
int mlxr_delta_chunked_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                            int64_t v_stride, const float *g, const float *beta, float *state, float *out,
                            int64_t t, int64_t hk, int64_t hv, int64_t dk, int64_t dv, int threads) {
    int64_t group = hv / hk;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        chunk_scratch cs_; /* 32 KB of triangles on the stack, the rows on the heap */
        chunk_scratch *cs = &cs_;
        cs->q = malloc(sizeof(float) * CHUNK * (3 * dk + dv));
        cs->k = cs->q + CHUNK * dk;
        cs->kt = cs->k + CHUNK * dk;
        cs->w = cs->kt + CHUNK * dk;
        if (!cs->q) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t h = 0; h < hv; h++) {
            if (!cs->q)
                continue;
            float *s = state + h * dk * dv;
            for (int64_t start = 0; start < t; start += CHUNK) {
                int64_t n = t - start < CHUNK ? t - start : CHUNK;
                chunk_load(cs, q + start * q_stride + (h / group) * dk, q_stride,
                           k + start * k_stride + (h / group) * dk, k_stride, g + start * hv + h,
                           beta + start * hv + h, hv, n, dk);
                chunk_head(cs, v + start * v_stride + h * dv, v_stride, s, out + (start * hv + h) * dv, hv * dv,
                           n, dk, dv);
            }
        }
        free(cs->q);
    }
    return failed; /* nonzero: out of memory, the output is incomplete */
}

static float silu(float x) { return x / (1.f + expf(-x)); }

/* Depthwise causal convolution then SiLU of one sequence: x [t, c] (rows x_stride apart),
 * state [c, width - 1] (the inputs before x, oldest first; replaced by the last width - 1),
 * weight [c, width], out [t, c]. Blocks of CONV_BLOCK channels are the threads' tasks, walked
 * token by token so that the inner loop runs along a row's channels. */
#define CONV_BLOCK 64
#define MAX_KEEP 16

void mlxr_causal_conv_f32(const float *x, int64_t x_stride, float *state, const float *weight, float *out,
                          int64_t t, int64_t c, int64_t width, int threads) {
    int64_t keep = width - 1, blocks = (c + CONV_BLOCK - 1) / CONV_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t c0 = blk * CONV_BLOCK, n = c - c0 < CONV_BLOCK ? c - c0 : CONV_BLOCK;
        float before[MAX_KEEP][CONV_BLOCK], w[MAX_KEEP + 1][CONV_BLOCK], acc[CONV_BLOCK];
        for (int64_t j = 0; j < n; j++) {
            for (int64_t m = 0; m < keep; m++)
                before[m][j] = state[(c0 + j) * keep + m];
            for (int64_t m = 0; m < width; m++)
                w[m][j] = weight[(c0 + j) * width + m];
        }
        for (int64_t i = 0; i < t; i++) {
            for (int64_t j = 0; j < n; j++)
                acc[j] = 0.f;
            for (int64_t m = 0; m < width; m++) {
                int64_t src = i - keep + m; /* this tap's input token; < 0: from the state */
                const float *row = src < 0 ? before[keep + src] : x + src * x_stride + c0;
                for (int64_t j = 0; j < n; j++)
                    acc[j] += w[m][j] * row[j];
            }
            float *o = out + i * c + c0;
            for (int64_t j = 0; j < n; j++)
                o[j] = silu(acc[j]);
        }
        for (int64_t m = 0; m < keep; m++) {
            int64_t src = t - keep + m;
            const float *row = src < 0 ? before[keep + src] : x + src * x_stride + c0;
            for (int64_t j = 0; j < n; j++)
                state[(c0 + j) * keep + m] = row[j];
        }
    }
}

/* One token for each of b rows: x [b, c] (rows x_stride apart), pool [slots, c, width - 1] whose
 * slot slots[r] is row r's state (in place), weight [c, width], out [b, c]. seq_lens as in
 * mlxr_delta_step_f32: a fresh row's state is zeros and is written, not read. */
void mlxr_causal_conv_step_f32(const float *x, int64_t x_stride, float *pool, const int64_t *slots,
                               const int64_t *seq_lens, const float *weight, float *out, int64_t b, int64_t c,
                               int64_t width, int threads) {
    int64_t keep = width - 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < b * c; task++) {
        int64_t r = task / c, ch = task % c;
        int fresh = seq_lens && seq_lens[r] == 1;
        const float *w = weight + ch * width;
        float *st = pool + (slots[r] * c + ch) * keep;
        float xi = x[r * x_stride + ch], acc = w[keep] * xi;
        for (int64_t m = 0; m < keep && !fresh; m++)
            acc += w[m] * st[m];
        out[task] = silu(acc);
        for (int64_t m = 0; m + 1 < keep; m++)
            st[m] = fresh ? 0.f : st[m + 1];
        if (keep)
            st[keep - 1] = xi;
    }
}
