/* Prompt matmuls by weight panels, #included by quant.c's AVX-512 VNNI build. A thread unpacks
 * 16 weight rows once into plain codes with per-unit scales (a panel) and runs every 16-row
 * tile of the prompt against it: on AMX tiles where the CPU has them (quant_amx.h), else with
 * vpdpbusd whose 16 int32 lanes are the tile's 16 activation rows. Same arithmetic as the row
 * kernel (dot_rows): activations as 16 bits (hi, lo int8 per 32 columns, quant32), weights as
 * unsigned codes u with w = s*u - o per 32 columns, integer dot products per unit, then
 *     y = sum_j dx_j * s_j * (256*sum(u*hi) + sum(u*lo)) - ofs * sum_j o_j * dx_j * sum(xq).
 * A unit is a sub-block of 32 columns, or half of one for Q6_K (its scales are per 16).
 *
 * Why panels on VNNI too: the row kernel takes one weight row against 8 activation rows with
 * the int32 lanes over sub-blocks, so every group of 256 columns costs each row a convert, a
 * scale and two permutes of scales besides its 8 vpdpbusd, and its activation tile (40 KB at
 * 2048 columns) barely fits L1 beside the weights. Lanes over activation rows need one
 * broadcast of 4 codes per 2 vpdpbusd and one convert and two FMAs per 16, and a panel (32 KB
 * of codes at 2048 columns) is unpacked once for the whole prompt. Intel Xeon with AMX turned
 * off, two threads, 128 rows, against the row kernel: Q4_K 1.5-1.7x, Q8_0 1.6-1.8x, Q5_0 2.1x,
 * Q6_K 1.2x (MLXR_AMX=0 bench/probes/prefill_matmul.py, prefill_matmul-20261129T125619Z). */

#define PANEL_SUB_BYTES 512 /* one sub-block of a panel: 16 rows x 32 codes; of an activation tile: 8 x 64 */
#define PANEL_ACT_FLOATS 64 /* per activation tile and sub-block: dx, dx * sum(xq) per 32, per 16 (two) */
#define PANEL_ROWS 8        /* weight rows a VNNI pass holds in registers: 16 int32 sums and 8 accumulators */

/* 1 for Q6_K (units of 16 columns), else 0 (32). */
static inline int unit_shift(int t) { return t == T_Q6_K; }

/* The prompt, per 16-row tile and sub-block j: hi then lo, each 8 vectors of 4 columns x 16
 * rows (byte 64*(c/4) + 4*r + c%4 holds column c of row r: Q6_K's half h is vectors 4h..4h+3;
 * AMX's VNNI-packed B tiles), and PANEL_ACT_FLOATS floats per row: dx, dx * sum(xq), dx *
 * sum(xq) over columns 0-15, over 16-31. Rows past m are zero. */
typedef struct {
    int8_t *b;
    float *s;
    int64_t tiles, subs;
} panel_acts;

static int panel_acts_alloc(panel_acts *a, int64_t m, int64_t k) {
    a->tiles = (m + 15) / 16, a->subs = k / 32;
    a->b = (int8_t *)scratch(0, (size_t)(a->tiles * a->subs * 2 * PANEL_SUB_BYTES));
    a->s = (float *)scratch(1, sizeof(float) * (size_t)(a->tiles * a->subs * PANEL_ACT_FLOATS));
    return a->b && a->s ? 0 : -1;
}

static void panel_quantize_tile(const float *x, int64_t m, int64_t k, panel_acts *a, int64_t tile) {
    int8_t *tb = a->b + tile * a->subs * 2 * PANEL_SUB_BYTES;
    float *ts = a->s + tile * a->subs * PANEL_ACT_FLOATS;
    memset(tb, 0, (size_t)(a->subs * 2 * PANEL_SUB_BYTES));
    memset(ts, 0, sizeof(float) * (size_t)(a->subs * PANEL_ACT_FLOATS));
    const int64_t rows = m - 16 * tile < 16 ? m - 16 * tile : 16;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < a->subs; j++) {
            int8_t hi[32], lo[32], *b = tb + j * 2 * PANEL_SUB_BYTES;
            int32_t sums[2];
            float d = quant32(x + (16 * tile + r) * k + 32 * j, hi, lo, sums);
            for (int q = 0; q < 8; q++) {
                memcpy(b + 64 * q + 4 * r, hi + 4 * q, 4);
                memcpy(b + PANEL_SUB_BYTES + 64 * q + 4 * r, lo + 4 * q, 4);
            }
            float *rec = ts + PANEL_ACT_FLOATS * j + r;
            rec[0] = d, rec[16] = d * (float)(sums[0] + sums[1]), rec[32] = d * (float)sums[0], rec[48] = d * (float)sums[1];
        }
    }
}

static void panel_quantize(const float *x, int64_t m, int64_t k, panel_acts *a, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (a->tiles > 1)
    for (int64_t i = 0; i < a->tiles; i++) panel_quantize_tile(x, m, k, a, i);
}

/* 16 weight rows: codes [unit][row][32 or 16], then scales s and offsets o [unit][row], o already
 * times -ofs (a power of two, so exact) so that the offsets add. */
typedef struct {
    uint8_t *codes;
    float *s, *o;
} weight_panel;

static int panel_alloc(weight_panel *p, int64_t units, int shift) {
    const size_t codes = (size_t)units * (PANEL_SUB_BYTES >> shift);
    uint8_t *buf = (uint8_t *)scratch(2, codes + (size_t)units * 2 * 16 * sizeof(float));
    if (!buf) return -1;
    p->codes = buf, p->s = (float *)(buf + codes), p->o = p->s + units * 16;
    return 0;
}

/* Q6_K's 16 scales of a block (d times the int8 scale of each 16 columns). */
static inline __m512 q6_scales(const uint8_t *g) {
    return _mm512_mul_ps(_mm512_set1_ps(f16(g + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 192)))));
}

/* A group's codes (group_codes: lane j of vector v = columns 8v..8v+7 of sub-block j) to
 * their panel rows: sub-block j's 32 codes at dst + j * PANEL_SUB_BYTES, by a 4 x 8 transpose of
 * 64-bit lanes (a quarter of a prompt's panel time went to copying them 8 bytes at a time). */
static inline void store_group_codes(const __m512i u[4], uint8_t *dst) {
    const __m512i a = _mm512_unpacklo_epi64(u[0], u[1]), b = _mm512_unpacklo_epi64(u[2], u[3]); /* even j */
    const __m512i c = _mm512_unpackhi_epi64(u[0], u[1]), d = _mm512_unpackhi_epi64(u[2], u[3]); /* odd j */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const __m512i e[4] = {_mm512_permutex2var_epi64(a, lo, b), _mm512_permutex2var_epi64(c, lo, d),
                          _mm512_permutex2var_epi64(a, hi, b), _mm512_permutex2var_epi64(c, hi, d)};
    for (int q = 0; q < 4; q++) { /* e[q]: sub-blocks 4(q/2) + q%2 (low half) and that + 2 (high) */
        const int j = 4 * (q / 2) + q % 2;
        _mm256_storeu_si256((__m256i *)(dst + j * PANEL_SUB_BYTES), _mm512_castsi512_si256(e[q]));
        _mm256_storeu_si256((__m256i *)(dst + (j + 2) * PANEL_SUB_BYTES), _mm512_extracti64x4_epi64(e[q], 1));
    }
}

/* Weight rows [n0, n0 + nr) into p (rows past nr zero). group_codes gives a group's codes as
 * four vectors in which 64-bit lane j holds 8 consecutive columns of sub-block j (vector v:
 * columns 8v..8v+7), so a sub-block's 32 codes are lane j of the four, in column order. */
static inline __attribute__((always_inline)) void panel_unpack(
    int t, const uint8_t *w, int64_t n0, int nr, int64_t k, int64_t subs, weight_panel *p) {
    const int64_t rb = k / BLOCK_ELEMS[t] * BLOCK_BYTES[t];
    const float neg_ofs = -code_offset(t);
    if (nr < 16) {
        memset(p->codes, 0, (size_t)(subs * PANEL_SUB_BYTES));
        memset(p->s, 0, sizeof(float) * (size_t)(subs * 32 << unit_shift(t)));
    }
    for (int i = 0; i < nr; i++) {
        const uint8_t *row = w + (n0 + i) * rb;
        for (int64_t g = 0; 8 * g < subs; g++) {
            const int nblk = subs - 8 * g < 8 ? (int)(subs - 8 * g) : 8;
            const uint8_t *gp = row + (BLOCK_ELEMS[t] == 32 ? 8 * g * BLOCK_BYTES[t] : g * BLOCK_BYTES[t]);
            __m512i u[4];
            uint64_t lanes[4][8];
            float so[16];
            group_codes(t, gp, nblk, u);
            if (t == T_Q6_K) { /* unit 2*sub + h: columns 16h..16h+15, vectors 2h and 2h + 1 */
                for (int v = 0; v < 4; v++) _mm512_storeu_si512((void *)lanes[v], u[v]);
                _mm512_storeu_ps(so, q6_scales(gp));
                for (int q = 0; q < 16; q++) {
                    const int64_t unit = 16 * g + q;
                    for (int v = 0; v < 2; v++) memcpy(p->codes + unit * (PANEL_SUB_BYTES / 2) + 16 * i + 8 * v, &lanes[2 * (q & 1) + v][q >> 1], 8);
                    p->s[16 * unit + i] = so[q], p->o[16 * unit + i] = neg_ofs * so[q];
                }
                continue;
            }
            if (nblk == 8) {
                store_group_codes(u, p->codes + 8 * g * PANEL_SUB_BYTES + 32 * i);
            } else { /* a 32-column type's partial last group */
                for (int v = 0; v < 4; v++) _mm512_storeu_si512((void *)lanes[v], u[v]);
                for (int j = 0; j < nblk; j++)
                    for (int v = 0; v < 4; v++) memcpy(p->codes + (8 * g + j) * PANEL_SUB_BYTES + 32 * i + 8 * v, &lanes[v][j], 8);
            }
            _mm512_storeu_ps(so, t == T_Q4_K || t == T_Q5_K ? kscales(gp) : block_scales_offsets(t, gp, nblk));
            for (int j = 0; j < nblk; j++) p->s[16 * (8 * g + j) + i] = so[j], p->o[16 * (8 * g + j) + i] = neg_ofs * so[8 + j];
        }
    }
}

/* v[i][r] (weight row i, activation row r) into y's rows 16*tile.., columns n0 .. n0 + nr: one
 * store of nr floats per output row. Stored a float at a time, the 16 rows' lines (n floats
 * apart) fell in one L1 set when n is a power of two and every write missed: Gemma 3's 4096 x
 * 640 gate/up ran at 237 GFLOP/s against 345 for 1536 x 640 (AMX, 2 threads, 128 rows). */
static void panel_store(float v[16][16], int64_t tile, int64_t m, float *y, int64_t n, int64_t n0, int nr) {
    const int64_t rows = m - 16 * tile < 16 ? m - 16 * tile : 16;
    for (int64_t r = 0; r < rows; r++) {
        float out[16];
        for (int i = 0; i < 16; i++) out[i] = v[i][r];
        memcpy(y + (16 * tile + r) * n + n0, out, sizeof(float) * (size_t)nr);
    }
}

/* Unit u of weight rows g .. g + PANEL_ROWS against one activation tile (b, s: its data) into
 * acc[i] (lanes: the tile's activation rows). A broadcast of 4 codes serves the hi and the lo
 * product; hi and lo sum in separate registers, so no chain is longer than 8 vpdpbusd. */
static inline __attribute__((always_inline)) void vnni_unit(
    const weight_panel *p, const int8_t *b, const float *s, int64_t u, int shift, int g, __m512 *acc) {
    const uint8_t *codes = p->codes + u * (PANEL_SUB_BYTES >> shift) + g * (32 >> shift);
    const int8_t *hi = b + (u >> shift) * 2 * PANEL_SUB_BYTES + (u & shift) * 256, *lo = hi + PANEL_SUB_BYTES;
    const float *rec = s + PANEL_ACT_FLOATS * (u >> shift), *ws = p->s + 16 * u + g, *wo = p->o + 16 * u + g;
    const __m512 dx = _mm512_load_ps(rec), dsum = _mm512_load_ps(rec + (shift ? 32 + 16 * (u & 1) : 16));
    __m512i h[PANEL_ROWS], l[PANEL_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < PANEL_ROWS; i++) h[i] = l[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int q = 0; q < (8 >> shift); q++) {
        const __m512i ah = _mm512_load_si512((const void *)(hi + 64 * q)), al = _mm512_load_si512((const void *)(lo + 64 * q));
#pragma GCC unroll 8
        for (int i = 0; i < PANEL_ROWS; i++) {
            int32_t four;
            memcpy(&four, codes + i * (32 >> shift) + 4 * q, 4);
            const __m512i c = _mm512_set1_epi32(four);
            h[i] = _mm512_dpbusd_epi32(h[i], c, ah);
            l[i] = _mm512_dpbusd_epi32(l[i], c, al);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < PANEL_ROWS; i++) {
        const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(h[i], 8), l[i]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dx, _mm512_set1_ps(ws[i])), acc[i]);
        acc[i] = _mm512_fmadd_ps(dsum, _mm512_set1_ps(wo[i]), acc[i]);
    }
}

/* Panel p against activation tile `tile` on VNNI, PANEL_ROWS weight rows a pass. */
static void vnni_panel_tile(const weight_panel *p, const panel_acts *a, int shift, int64_t tile, int64_t m,
                            float *y, int64_t n, int64_t n0, int nr) {
    float v[16][16] __attribute__((aligned(64)));
    const int8_t *b = a->b + tile * a->subs * 2 * PANEL_SUB_BYTES;
    const float *s = a->s + tile * a->subs * PANEL_ACT_FLOATS;
    const int64_t units = a->subs << shift;
    for (int g = 0; g < 16; g += PANEL_ROWS) {
        __m512 acc[PANEL_ROWS];
        for (int i = 0; i < PANEL_ROWS; i++) acc[i] = _mm512_setzero_ps();
        if (shift) /* a literal shift per loop, so vnni_unit's loops unroll */
            for (int64_t u = 0; u < units; u++) vnni_unit(p, b, s, u, 1, g, acc);
        else
            for (int64_t u = 0; u < units; u++) vnni_unit(p, b, s, u, 0, g, acc);
        for (int i = 0; i < PANEL_ROWS; i++) _mm512_store_ps(v[g + i], acc[i]);
    }
    panel_store(v, tile, m, y, n, n0, nr);
}

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
#define MLXR_AMX 1
#include "quant_amx.h"
#endif

/* From 32 rows, Q6_K from 48 (its 16-column units scale twice as often): at 16 and 24 rows the
 * row kernel won on every shape (0.7-0.9x), at 32 the panels on all but Q6_K (1.0-1.4x; Q6_K
 * 0.9x), at 48 on all (1.1-1.5x; Intel Xeon with AMX turned off, two threads,
 * bench/probes/amx_matmul.py --arms vnni_panels vnni_rows, amx_matmul-20261129T125112Z).
 * MLXR_VNNI_PANELS=0 (read each call, for tests and benches) keeps every matmul on the row
 * kernel where AMX does not take it. */
#define VNNI_PANEL_MIN_ROWS 32
#define VNNI_PANEL_MIN_ROWS_Q6_K 48
#if defined(MLXR_AMX) && AMX_MIN_ROWS < VNNI_PANEL_MIN_ROWS
#error "panel_qmatmul returns early below VNNI_PANEL_MIN_ROWS: the AMX minimum must not be lower"
#endif

static int vnni_panels_enabled(void) {
    const char *env = getenv("MLXR_VNNI_PANELS");
    return !(env && env[0] == '0');
}

typedef struct {
    int t, amx;
    const uint8_t *w;
    int64_t n, k, m;
    const panel_acts *a;
    float *y;
    int failed; /* a thread could not allocate its panel: the caller redoes the matmul */
} panel_job;

/* Panels [c0, c1) (units of 16 weight rows). */
static void panel_chunk(void *ctx, int64_t c0, int64_t c1) {
    panel_job *j = (panel_job *)ctx;
    weight_panel p;
    const int shift = unit_shift(j->t);
    if (panel_alloc(&p, j->a->subs << shift, shift)) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
#ifdef MLXR_AMX
    if (j->amx) amx_configure(shift);
#endif
    for (int64_t c = c0; c < c1; c++) {
        const int nr = j->n - 16 * c < 16 ? (int)(j->n - 16 * c) : 16;
        switch (j->t) { /* a literal type per call, so group_codes' switch folds away */
        case T_Q4_0: panel_unpack(T_Q4_0, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q4_1: panel_unpack(T_Q4_1, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q5_0: panel_unpack(T_Q5_0, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q8_0: panel_unpack(T_Q8_0, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q4_K: panel_unpack(T_Q4_K, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q5_K: panel_unpack(T_Q5_K, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        default: panel_unpack(T_Q6_K, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        }
        for (int64_t tile = 0; tile < j->a->tiles; tile++) {
#ifdef MLXR_AMX
            if (j->amx) {
                amx_panel_tile(&p, j->a, shift, tile, j->m, j->y, j->n, 16 * c, nr);
                continue;
            }
#endif
            vnni_panel_tile(&p, j->a, shift, tile, j->m, j->y, j->n, 16 * c, nr);
        }
    }
#ifdef MLXR_AMX
    if (j->amx) _tile_release();
#endif
}

/* The fewest rows that take type t's matmuls to panels: on AMX tiles where they are enabled,
 * else on VNNI (0: never, MLXR_VNNI_PANELS=0). */
static int panel_min_rows(int t) {
#ifdef MLXR_AMX
    if (amx_enabled()) return amx_min_rows(t);
#endif
    if (!vnni_panels_enabled()) return 0;
    return t == T_Q6_K ? VNNI_PANEL_MIN_ROWS_Q6_K : VNNI_PANEL_MIN_ROWS;
}

/* 0 when done by panels, else the caller takes the row kernel. */
static int panel_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int nthreads) {
    if (m < VNNI_PANEL_MIN_ROWS) return -1; /* below every path's minimum: decode's calls read no environment */
    const int min_rows = panel_min_rows(t);
    if (!min_rows || m < min_rows) return -1;
    panel_acts a;
    if (panel_acts_alloc(&a, m, k)) return -1;
    panel_quantize(x, m, k, &a, nthreads);
    panel_job job = {t, 0, w, n, k, m, &a, y, 0};
#ifdef MLXR_AMX
    job.amx = amx_enabled();
#endif
    const int64_t panels = (n + 15) / 16, chunk = panels / (8 * (int64_t)(nthreads > 0 ? nthreads : 1));
    run_chunks(nthreads, m, panels, chunk > 0 ? chunk : 1, panel_chunk, &job);
    return job.failed ? -1 : 0;
}
