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
#define ROWS 8 /* rows of a chunk sharing one pass over the state (it stays in L1 for them) */

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
    /* k_i.k_j and q_i.k_j for every j of the chunk (whole rows vectorize; j > i is left unread) */
    for (int64_t i = 0; i < n; i++) {
        float *kk = cs->kk[i], *qk = cs->qk[i];
        for (int64_t j = 0; j < CHUNK; j++)
            kk[j] = qk[j] = 0.f;
        for (int64_t d = 0; d < dk; d++) {
            const float *col = KT(d);
            float kd = K(i)[d], qd = Q(i)[d];
            for (int64_t j = 0; j < CHUNK; j++) {
                kk[j] += kd * col[j];
                qk[j] += qd * col[j];
            }
        }
        for (int64_t j = 0; j <= i; j++) {
            float decay = expf(cs->c[i] - cs->c[j]);
            kk[j] *= decay * cs->b[i];
            qk[j] *= decay;
        }
    }
}

/* w_i = k_i^T S and o_i = q_i^T S for the chunk's rows, ROWS of them a pass over S. */
static void chunk_read_state(chunk_scratch *cs, const float *s, float *o, int64_t o_stride, int64_t n, int64_t dk,
                             int64_t dv) {
    for (int64_t i0 = 0; i0 < n; i0 += ROWS) {
        int64_t rows = n - i0 < ROWS ? n - i0 : ROWS;
        for (int64_t i = i0; i < i0 + rows; i++)
            for (int64_t j = 0; j < dv; j++)
                W(i)[j] = o[i * o_stride + j] = 0.f;
        for (int64_t d = 0; d < dk; d++) {
            const float *row = s + d * dv;
            for (int64_t i = i0; i < i0 + rows; i++) {
                float *w = W(i), *oi = o + i * o_stride, kd = K(i)[d], qd = Q(i)[d];
                for (int64_t j = 0; j < dv; j++) {
                    w[j] += kd * row[j];
                    oi[j] += qd * row[j];
                }
            }
        }
    }
}

static void chunk_head(chunk_scratch *cs, const float *v, int64_t v_stride, float *s, float *o, int64_t o_stride,
                       int64_t n, int64_t dk, int64_t dv) {
    /* W_i = b_i (v_i - exp(c_i) k_i^T S) - sum_{j<i} kk_ij W_j, in token order (the unit-triangular solve);
     * o_i = exp(c_i) q_i^T S + sum_{j<=i} qk_ij W_j, both reading the entering state. */
    chunk_read_state(cs, s, o, o_stride, n, dk, dv);
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
        for (int64_t m = 0; m <= i; m++) {
            const float *wm = W(m);
            float a = cs->qk[i][m];
            for (int64_t j = 0; j < dv; j++)
                oi[j] += a * wm[j];
        }
    }
    /* S = exp(c_last) S + sum_m exp(c_last - c_m) k_m W_m^T */
    float last = cs->c[n - 1], tail[CHUNK], el = expf(last);
    for (int64_t m = 0; m < n; m++)
        tail[m] = expf(last - cs->c[m]);
    for (int64_t d = 0; d < dk; d++) {
        float *row = s + d * dv;
        const float *col = KT(d);
        for (int64_t j = 0; j < dv; j++)
            row[j] *= el;
        for (int64_t m = 0; m < n; m++) {
            float a = tail[m] * col[m];
            const float *wm = W(m);
            for (int64_t j = 0; j < dv; j++)
                row[j] += a * wm[j];
        }
    }
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
