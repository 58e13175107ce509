/* Attention pieces for float32 on the CPU, one call per layer where torch needs 15-30 small
 * ops (each a microsecond or more of dispatch; a decode step runs them for every layer). The
 * attention itself is tiled (attention_tiles.h): prompts in blocks of query rows over K/V tiles
 * with an online softmax, decode split over the context by partition and merged.
 *
 * Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim] for K and V; a
 * token's slot is block * block_size + offset. The paged kernels read caches of any format in
 * attention_rows.h (fmt, rb bytes a row), converting each tile's rows to float32 as they load it. Same math as the torch reference in
 * mlxr/ops/attention/paged_attention.py and mlxr/ops/rotary/rotary.py, in fp32. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "attention_rows.h"

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
 * slot, each cache row stored in format fmt (rb bytes; attention_rows.h). inv_freq NULL: no
 * rotation (q_out untouched). */
void mlxr_rope_write_kv_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                            const float *v, int64_t v_stride, const int64_t *pos, const float *inv_freq,
                            int64_t t, int64_t h, int64_t kh, int64_t d, float *q_out, uint8_t *kc,
                            uint8_t *vc, int fmt, int64_t rb, const int64_t *slots) {
    float c[512], s[512], row[1024]; /* d <= 1024, checked by the caller */
    for (int64_t i = 0; i < t; i++) {
        uint8_t *kslot = kc + slots[i] * kh * rb, *vslot = vc + slots[i] * kh * rb;
        for (int64_t j = 0; j < kh; j++) encode_row(fmt, v + i * v_stride + j * d, d, vslot + j * rb);
        if (!inv_freq) {
            for (int64_t j = 0; j < kh; j++) encode_row(fmt, k + i * k_stride + j * d, d, kslot + j * rb);
            continue;
        }
        for (int64_t j = 0; j < d / 2; j++) {
            float f = (float)pos[i] * inv_freq[j];
            c[j] = cosf(f);
            s[j] = sinf(f);
        }
        for (int64_t j = 0; j < h; j++) rotate(q + i * q_stride + j * d, c, s, d, q_out + (i * h + j) * d);
        for (int64_t j = 0; j < kh; j++) {
            if (fmt == KV_F32) {
                rotate(k + i * k_stride + j * d, c, s, d, (float *)(kslot + j * rb));
            } else {
                rotate(k + i * k_stride + j * d, c, s, d, row);
                encode_row(fmt, row, d, kslot + j * rb);
            }
        }
    }
}

/* Fold the tile at t0 into st for r rows seeing [lo[i], hi[i]); positions from `last` on (past
 * what any row sees) read the zero row. */
static void attend_tile(const kv_view *v, int64_t r, const int64_t *lo, const int64_t *hi, int64_t t0, int64_t last,
                        tile_scratch *w, soft_state *st) {
    const int64_t d = v->d;
    const int simd = SIMD_DIM(d);
    for (int64_t j = 0; j < TK; j++) {
        if (t0 + j >= last) {
            w->krow[j] = w->vrow[j] = v->zero;
        } else if (v->fmt == KV_F32) {
            w->krow[j] = (const float *)kv_row(v->kc, v, t0 + j);
            w->vrow[j] = (const float *)kv_row(v->vc, v, t0 + j);
        } else { /* converted as the tile is loaded: the cache is read in its own width */
            decode_row(v->fmt, kv_row(v->kc, v, t0 + j), d, w->kbuf + j * d);
            decode_row(v->fmt, kv_row(v->vc, v, t0 + j), d, w->vbuf + j * d);
            w->krow[j] = w->kbuf + j * d;
            w->vrow[j] = w->vbuf + j * d;
        }
    }
    if (simd) {
        pack_keys(w->krow, d, w->kt);
        tile_scores(w->q, r, d, w->kt, w->s);
    } else {
        scores_plain(w->q, r, d, w->krow, w->s);
    }
    for (int64_t i = 0; i < r; i++) {
        float *s = w->s + i * TK;
        const int64_t j0 = lo[i] > t0 ? lo[i] - t0 : 0, j1 = hi[i] - t0 < TK ? hi[i] - t0 : TK;
        if (j0 >= j1) { /* nothing visible: the row's state stays as it is */
            memset(s, 0, sizeof(float) * TK);
            w->alpha[i] = 1.0f;
            continue;
        }
        for (int64_t j = j0; j < j1; j++) {
            const float x = s[j] * v->scale;
            s[j] = v->softcap > 0.0f ? tanhf(x / v->softcap) * v->softcap : x;
        }
        float m = st->m[i];
        const float sum = simd ? tile_weights(s, j0, j1, &m) : weights_plain(s, j0, j1, &m);
        w->alpha[i] = expf(st->m[i] - m); /* 0 on the first visible tile (m was -inf) */
        st->l[i] = st->l[i] * w->alpha[i] + sum;
        st->m[i] = m;
    }
    if (simd)
        tile_values(w->s, w->vrow, w->alpha, r, d, st->acc);
    else
        values_plain(w->s, w->vrow, w->alpha, r, d, st->acc);
}

/* Fold part (one partition's rows) into total, row by row; an empty side changes nothing. */
static void state_merge(soft_state *total, const soft_state *part, int64_t r, int64_t d) {
    for (int64_t i = 0; i < r; i++) {
        const float mp = part->m[i], mt = total->m[i];
        float *a = total->acc + i * d;
        const float *b = part->acc + i * d;
        if (mp == -INFINITY) continue;
        if (mt == -INFINITY) {
            total->m[i] = mp, total->l[i] = part->l[i];
            memcpy(a, b, sizeof(float) * (size_t)d);
            continue;
        }
        const float m = mp > mt ? mp : mt, x = expf(mt - m), y = expf(mp - m);
        total->l[i] = total->l[i] * x + part->l[i] * y;
        total->m[i] = m;
        for (int64_t c = 0; c < d; c++) a[c] = a[c] * x + b[c] * y;
    }
}

/* Tiles [start, end) into part, which restarts at each multiple of PART after merging into total. */
static void attend_span(const kv_view *v, int64_t r, const int64_t *lo, const int64_t *hi, int64_t start, int64_t end,
                        tile_scratch *w, soft_state *part, soft_state *total) {
    for (int64_t t0 = start; t0 < end; t0 += TK) {
        if (t0 % PART == 0 && t0 != start) {
            state_merge(total, part, r, v->d);
            state_reset(part, r, v->d);
        }
        attend_tile(v, r, lo, hi, t0, end, w, part);
    }
}

/* Normalised rows into the output: row i is head i % g of token i / g (tokens h * d apart). With
 * sink (one logit per head of the group, gpt-oss's attention sinks), each row's denominator also
 * counts e^sink: the sink takes its share of the softmax and adds nothing to the sum of values. */
static void state_finish(const soft_state *st, int64_t r, int64_t g, int64_t h, int64_t d, const float *sink,
                         float *out) {
    for (int64_t i = 0; i < r; i++) {
        float *o = out + (i / g) * h * d + (i % g) * d;
        const float *a = st->acc + i * d;
        float l = st->l[i];
        if (sink && l > 0.0f) l += expf(sink[i % g] - st->m[i]);
        for (int64_t c = 0; c < d; c++) o[c] = l > 0.0f ? a[c] / l : 0.0f;
    }
}

static void *scratch_alloc(size_t bytes, int *failed) {
    void *p = malloc(bytes);
    if (!p) *failed = 1;
    return p;
}

/* One thread's scratch for blocks of up to r rows of head dim d; NULL on failure. */
static float *scratch_init(tile_scratch *w, int64_t r, int64_t d) {
    const int64_t floats = (r * d + 3 * d * TK + r * TK + r + 2 * r * (d + 2) + 15) / 16 * 16; /* pointers after: aligned */
    float *mem = (float *)malloc(sizeof(float) * (size_t)floats + sizeof(float *) * 2 * TK + sizeof(int64_t) * 2 * r);
    if (!mem) return NULL;
    w->q = mem, w->kt = w->q + r * d, w->s = w->kt + d * TK, w->alpha = w->s + r * TK;
    w->part = (soft_state){w->alpha + r, w->alpha + 2 * r, w->alpha + 3 * r};
    w->total = (soft_state){w->part.acc + r * d, w->part.acc + r * d + r, w->part.acc + r * d + 2 * r};
    w->kbuf = w->total.acc + r * d, w->vbuf = w->kbuf + d * TK;
    w->krow = (const float **)(mem + floats);
    w->vrow = w->krow + TK;
    return mem;
}

static int64_t *row_bounds(tile_scratch *w) { return (int64_t *)(w->vrow + TK); }

static int64_t window_start(int64_t hi, int64_t window) { return window > 0 && hi > window ? hi - window : 0; }

/* One new token per sequence: q [S, H, d] contiguous attends over its sequence's first
 * seq_lens[s] cached tokens (the last window of them if window > 0); out [S, H, d]. Each
 * sequence's KV heads split by partition (PART positions) over the threads, then merged in
 * order. Returns -1 when scratch memory cannot be had. */
int mlxr_paged_decode_f32(const float *q, const uint8_t *kc, const uint8_t *vc, int fmt, int64_t rb,
                          const int64_t *tables, int64_t max_blocks, const int64_t *seq_lens, int64_t ns, int64_t h,
                          int64_t kh, int64_t d, int64_t bs, float scale, int64_t window, float softcap,
                          const float *sinks, float *out, int nthreads) {
    const int64_t g = h / kh, state = g * (d + 2);
    int64_t parts = 0, work = 0;
    for (int64_t s = 0; s < ns; s++) {
        const int64_t len = seq_lens[s];
        parts += len > 0 ? (len - 1) / PART - window_start(len, window) / PART + 1 : 0;
        work += len;
    }
    int failed = 0;
    fp8_table_init();
    int64_t *item = (int64_t *)scratch_alloc(sizeof(int64_t) * (size_t)(2 * ns + 2 * parts + 1), &failed);
    float *partial = (float *)scratch_alloc(sizeof(float) * (size_t)(parts * kh * state + 1), &failed);
    float *zero = (float *)calloc((size_t)d, sizeof(float));
    if (failed || !zero) {
        free(item), free(partial), free(zero);
        return -1;
    }
    int64_t *first = item + 2 * parts, n = 0; /* item: (sequence, partition) pairs; first[s]: s's first */
    for (int64_t s = 0; s < ns; s++) {
        const int64_t len = seq_lens[s], lo = window_start(len, window);
        first[s] = n;
        for (int64_t p = lo / PART; len > 0 && p <= (len - 1) / PART; p++) item[2 * n] = s, item[2 * n + 1] = p, n++;
    }
    first[ns] = n;
    /* a parallel region costs a few microseconds: only worth it for enough context */
#pragma omp parallel num_threads(nthreads) if (work * h * d > (1 << 18)) reduction(| : failed)
    {
        tile_scratch w;
        float *mem = scratch_init(&w, g, d);
        if (!mem) failed = 1;
        int64_t *bound = mem ? row_bounds(&w) : NULL;
#pragma omp for schedule(dynamic)
        for (int64_t i = 0; i < parts * kh; i++) {
            const int64_t s = item[2 * (i / kh)], p = item[2 * (i / kh) + 1], kvh = i % kh, len = seq_lens[s];
            float *slot = partial + i * state;
            soft_state part = {slot, slot + g, slot + 2 * g};
            kv_view v = {kc, vc, zero, tables + s * max_blocks, bs, kh, kvh, d, rb, scale, softcap, fmt};
            if (!mem) continue;
            for (int64_t j = 0; j < g; j++) bound[j] = window_start(len, window), bound[g + j] = len;
            memcpy(w.q, q + (s * h + kvh * g) * d, sizeof(float) * (size_t)(g * d));
            state_reset(&part, g, d);
            const int64_t start = p * PART > bound[0] / TK * TK ? p * PART : bound[0] / TK * TK;
            attend_span(&v, g, bound, bound + g, start, (p + 1) * PART < len ? (p + 1) * PART : len, &w, &part, NULL);
        }
        free(mem);
    }
    /* the merge on this thread: a second barrier cost more than it (a busy core delays it) */
    tile_scratch w;
    float *mem = failed ? NULL : scratch_init(&w, g, d);
    for (int64_t i = 0; mem && i < ns * kh; i++) {
        const int64_t s = i / kh, kvh = i % kh;
        state_reset(&w.total, g, d);
        for (int64_t k = first[s]; k < first[s + 1]; k++) {
            float *slot = partial + (k * kh + kvh) * state;
            state_merge(&w.total, &(soft_state){slot, slot + g, slot + 2 * g}, g, d);
        }
        state_finish(&w.total, g, g, h, d, sinks ? sinks + kvh * g : NULL, out + (s * h + kvh * g) * d);
    }
    failed |= !mem;
    free(mem);
    free(item), free(partial), free(zero);
    return failed ? -1 : 0;
}

/* A block of up to ROWS query rows: tokens [t, t_end) of sequence s (positions ending at
 * last_pos), heads of KV head v->kvh; attends causally (and within the window) and writes out. */
static void prefill_block(const kv_view *v, const float *q, int64_t t, int64_t t_end, int64_t last_pos, int64_t q_end,
                          int64_t g, int64_t h, int64_t window, const float *sinks, tile_scratch *w, float *out) {
    const int64_t d = v->d, r = (t_end - t) * g;
    int64_t *lo = row_bounds(w), *hi = lo + r, start = INT64_MAX, end = 0;
    for (int64_t i = 0; i < r; i++) {
        const int64_t tok = t + i / g;
        hi[i] = last_pos - (q_end - 1 - tok) + 1;
        lo[i] = window_start(hi[i], window);
        start = lo[i] < start ? lo[i] : start;
        end = hi[i] > end ? hi[i] : end;
        memcpy(w->q + i * d, q + (tok * h + v->kvh * g + i % g) * d, sizeof(float) * (size_t)d);
    }
    state_reset(&w->part, r, d);
    state_reset(&w->total, r, d);
    attend_span(v, r, lo, hi, start / TK * TK, end, w, &w->part, &w->total);
    state_merge(&w->total, &w->part, r, d);
    state_finish(&w->total, r, g, h, d, sinks ? sinks + v->kvh * g : NULL, out + (t * h + v->kvh * g) * d);
}

/* A prompt's tokens (or several sequences' new tokens): q [T, H, d] contiguous, sequence s's
 * tokens at query_start[s]..query_start[s+1], its last one at position seq_lens[s] - 1. Each
 * token attends causally over its own sequence's cache (the last window positions if window >
 * 0), in blocks of consecutive tokens that share each K/V tile; a token's arithmetic is the
 * one its decode step runs (attention_tiles.h). Returns -1 when scratch memory cannot be had. */
int mlxr_paged_prefill_f32(const float *q, const uint8_t *kc, const uint8_t *vc, int fmt, int64_t rb,
                           const int64_t *tables, int64_t max_blocks, const int64_t *query_start,
                           const int64_t *seq_lens, int64_t ns, int64_t h, int64_t kh, int64_t d, int64_t bs,
                           float scale, int64_t window, float softcap, const float *sinks, float *out, int nthreads) {
    const int64_t g = h / kh, tq = ROWS / g > 1 ? ROWS / g : 1, tokens = query_start[ns];
    int64_t longest = 1, blocks = 0;
    for (int64_t s = 0; s < ns; s++) {
        longest = seq_lens[s] > longest ? seq_lens[s] : longest;
        blocks += (query_start[s + 1] - query_start[s] + tq - 1) / tq;
    }
    int failed = 0;
    fp8_table_init();
    int64_t *seq_of = (int64_t *)scratch_alloc(sizeof(int64_t) * (size_t)(blocks + 1), &failed);
    float *zero = (float *)calloc((size_t)d, sizeof(float));
    if (failed || !zero) {
        free(seq_of), free(zero);
        return -1;
    }
    int64_t *block_start = (int64_t *)malloc(sizeof(int64_t) * (size_t)(blocks + 1));
    if (!block_start) {
        free(seq_of), free(zero);
        return -1;
    }
    for (int64_t s = 0, b = 0; s < ns; s++)
        for (int64_t t = query_start[s]; t < query_start[s + 1]; t += tq) seq_of[b] = s, block_start[b++] = t;
#pragma omp parallel num_threads(nthreads) if (tokens * longest * h * d > (1 << 18)) reduction(| : failed)
    {
        tile_scratch w;
        float *mem = scratch_init(&w, tq * g, d);
        if (!mem) failed = 1;
#pragma omp for schedule(dynamic)
        for (int64_t i = blocks * kh - 1; i >= 0; i--) { /* later blocks see more: they go first */
            const int64_t b = i / kh, s = seq_of[b], t = block_start[b], q_end = query_start[s + 1];
            kv_view v = {kc, vc, zero, tables + s * max_blocks, bs, kh, i % kh, d, rb, scale, softcap, fmt};
            if (mem)
                prefill_block(&v, q, t, t + tq < q_end ? t + tq : q_end, seq_lens[s] - 1, q_end, g, h, window, sinks,
                              &w, out);
        }
        free(mem);
    }
    free(seq_of), free(block_start), free(zero);
    return failed ? -1 : 0;
}
