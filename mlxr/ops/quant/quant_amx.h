/* Prompt matmuls on Intel AMX tiles (AMX-INT8), #included by quant.c's AVX-512 VNNI build when
 * the compiler targets AMX (-march=native on a CPU that has it). Same arithmetic as the VNNI
 * kernel: activations as 16 bits (hi, lo int8 per 32 columns, quant32), weights as unsigned
 * codes u with w = s*u - o per 32 columns, integer dot products per 32-column sub-block, then
 *     y = sum_j dx_j * s_j * (256*sum(u*hi) + sum(u*lo)) - ofs * sum_j o_j * dx_j * sum(xq).
 * A tile product (TDPBUSD: u8 x s8 -> s32) takes 16 weight rows x 32 codes (A) against 16
 * activation rows (B: 32 columns, four a row, VNNI-packed) into 16x16 int32 sums per sub-block;
 * the sums leave the tile per sub-block because each has its own scales (per weight row and per
 * activation row). A thread unpacks a panel of 16 weight rows once (group_codes, the VNNI
 * kernel's unpacking) and runs it against every 16-row tile of the prompt.
 *
 * Q6_K's scales are per 16 columns: its products take 16 columns a time (a "unit" below is a
 * sub-block of 32 columns, or half of one for Q6_K). Fewer than amx_min_rows(t) rows stay on
 * the VNNI kernel.
 * Linux grants a process the tile state on request (arch_prctl ARCH_REQ_XCOMP_PERM); when it
 * refuses, or MLXR_AMX=0, every matmul takes the VNNI kernel. */
#include <sys/syscall.h>
#include <unistd.h>

/* From 32 rows: at 16 the tiles and the VNNI kernel tie (2048x2048 Q8_0, one thread: 1.07 against
 * 1.06 ms), and 17-31 rows would run a second tile mostly empty. Q6_K from 64: its 16-column units
 * scale twice as often, and below 64 rows the tiles lost or tied (2048x5632, two threads: 3.7-4.0
 * against 3.3-3.5 ms at 32 rows, 4.8-4.9 against 4.9-5.0 at 48, 6.1 against 6.8 at 64; 640x2048
 * 0.52 against 0.50 at 40; bench/probes/amx_matmul.py). */
#define AMX_MIN_ROWS 32
#define AMX_MIN_ROWS_Q6_K 64
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18
#define AMX_SUB_BYTES 512 /* one sub-block of a panel: 16 rows x 32 codes; of an activation tile: 8 x 64 */
#define AMX_ACT_FLOATS 64 /* per activation tile and sub-block: dx, dx * sum(xq) per 32, per 16 (two) */

/* 1 when this process may use the tiles (asked once) and MLXR_AMX is not "0" (read each call,
 * so a test or bench can compare both paths in one process). */
static int amx_enabled(void) {
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
    const char *env = getenv("MLXR_AMX");
    return granted && !(env && env[0] == '0');
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) amx_config;

/* 1 for Q6_K (units of 16 columns), else 0 (32). */
static inline int amx_shift(int t) { return t == T_Q6_K; }

static inline int amx_min_rows(int t) { return t == T_Q6_K ? AMX_MIN_ROWS_Q6_K : AMX_MIN_ROWS; }

/* Tiles: 0 = A (16 weight rows x a unit's 32 or 16 codes), 1 and 2 = B (hi, lo: 8 or 4 rows of
 * 4 columns x 16 activation rows), 3 and 4, 5 and 6 = C (16 x 16 int32 for hi and lo, two units
 * in flight). Per thread. */
static void amx_configure(int shift) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = 16, c.colsb[0] = 32 >> shift;
    c.rows[1] = c.rows[2] = 8 >> shift, c.colsb[1] = c.colsb[2] = 64;
    for (int i = 3; i <= 6; i++) c.rows[i] = 16, c.colsb[i] = 64;
    _tile_loadconfig(&c);
}

/* The prompt, per 16-row tile and sub-block j: hi then lo as B tiles (byte 64*(c/4) + 4*r +
 * c%4 holds column c of row r: Q6_K's half h is rows 4h..4h+3), and AMX_ACT_FLOATS floats per
 * row: dx, dx * sum(xq), dx * sum(xq) over columns 0-15, over 16-31. Rows past m are zero. */
typedef struct {
    int8_t *b;
    float *s;
    int64_t tiles, subs;
} amx_acts;

static int amx_acts_alloc(amx_acts *a, int64_t m, int64_t k) {
    a->tiles = (m + 15) / 16, a->subs = k / 32;
    a->b = (int8_t *)scratch(0, (size_t)(a->tiles * a->subs * 2 * AMX_SUB_BYTES));
    a->s = (float *)scratch(1, sizeof(float) * (size_t)(a->tiles * a->subs * AMX_ACT_FLOATS));
    return a->b && a->s ? 0 : -1;
}

static void amx_quantize_tile(const float *x, int64_t m, int64_t k, amx_acts *a, int64_t tile) {
    int8_t *tb = a->b + tile * a->subs * 2 * AMX_SUB_BYTES;
    float *ts = a->s + tile * a->subs * AMX_ACT_FLOATS;
    memset(tb, 0, (size_t)(a->subs * 2 * AMX_SUB_BYTES));
    memset(ts, 0, sizeof(float) * (size_t)(a->subs * AMX_ACT_FLOATS));
    const int64_t rows = m - 16 * tile < 16 ? m - 16 * tile : 16;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < a->subs; j++) {
            int8_t hi[32], lo[32], *b = tb + j * 2 * AMX_SUB_BYTES;
            int32_t sums[2];
            float d = quant32(x + (16 * tile + r) * k + 32 * j, hi, lo, sums);
            for (int q = 0; q < 8; q++) {
                memcpy(b + 64 * q + 4 * r, hi + 4 * q, 4);
                memcpy(b + AMX_SUB_BYTES + 64 * q + 4 * r, lo + 4 * q, 4);
            }
            float *rec = ts + AMX_ACT_FLOATS * j + r;
            rec[0] = d, rec[16] = d * (float)(sums[0] + sums[1]), rec[32] = d * (float)sums[0], rec[48] = d * (float)sums[1];
        }
    }
}

static void amx_quantize(const float *x, int64_t m, int64_t k, amx_acts *a, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (a->tiles > 1)
    for (int64_t i = 0; i < a->tiles; i++) amx_quantize_tile(x, m, k, a, i);
}

/* 16 weight rows as A tiles: codes [unit][row][32 or 16], then scales s and offsets o [unit][row]. */
typedef struct {
    uint8_t *codes;
    float *s, *o;
} amx_panel;

static int amx_panel_alloc(amx_panel *p, int64_t units, int shift) {
    const size_t codes = (size_t)units * (AMX_SUB_BYTES >> shift);
    uint8_t *buf = (uint8_t *)scratch(2, codes + (size_t)units * 2 * 16 * sizeof(float));
    if (!buf) return -1;
    p->codes = buf, p->s = (float *)(buf + codes), p->o = p->s + units * 16;
    return 0;
}

/* Q6_K's 16 scales of a block (d times the int8 scale of each 16 columns). */
static inline __m512 q6_scales(const uint8_t *g) {
    return _mm512_mul_ps(_mm512_set1_ps(f16(g + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 192)))));
}

/* Weight rows [n0, n0 + nr) into p (rows past nr zero). group_codes gives a group's codes as
 * four vectors in which 64-bit lane j holds 8 consecutive columns of sub-block j (vector v:
 * columns 8v..8v+7), so a sub-block's 32 codes are lane j of the four, in column order. */
static inline __attribute__((always_inline)) void amx_unpack(
    int t, const uint8_t *w, int64_t n0, int nr, int64_t k, int64_t subs, amx_panel *p) {
    const int64_t rb = k / BLOCK_ELEMS[t] * BLOCK_BYTES[t];
    if (nr < 16) {
        memset(p->codes, 0, (size_t)(subs * AMX_SUB_BYTES));
        memset(p->s, 0, sizeof(float) * (size_t)(subs * 32 << amx_shift(t)));
    }
    for (int i = 0; i < nr; i++) {
        const uint8_t *row = w + (n0 + i) * rb;
        for (int64_t g = 0; 8 * g < subs; g++) {
            const int nblk = subs - 8 * g < 8 ? (int)(subs - 8 * g) : 8;
            const uint8_t *gp = row + (BLOCK_ELEMS[t] == 32 ? 8 * g * BLOCK_BYTES[t] : g * BLOCK_BYTES[t]);
            __m512i u[4];
            group_codes(t, gp, nblk, u);
            uint64_t lanes[4][8];
            float so[16];
            for (int v = 0; v < 4; v++) _mm512_storeu_si512((void *)lanes[v], u[v]);
            if (t == T_Q6_K) { /* unit 2*sub + h: columns 16h..16h+15, vectors 2h and 2h + 1 */
                _mm512_storeu_ps(so, q6_scales(gp));
                for (int q = 0; q < 16; q++) {
                    const int64_t unit = 16 * g + q;
                    for (int v = 0; v < 2; v++) memcpy(p->codes + unit * (AMX_SUB_BYTES / 2) + 16 * i + 8 * v, &lanes[2 * (q & 1) + v][q >> 1], 8);
                    p->s[16 * unit + i] = p->o[16 * unit + i] = so[q];
                }
                continue;
            }
            _mm512_storeu_ps(so, t == T_Q4_K || t == T_Q5_K ? kscales(gp) : block_scales_offsets(t, gp, nblk));
            for (int j = 0; j < nblk; j++) {
                const int64_t sub = 8 * g + j;
                for (int v = 0; v < 4; v++) memcpy(p->codes + sub * AMX_SUB_BYTES + 32 * i + 8 * v, &lanes[v][j], 8);
                p->s[16 * sub + i] = so[j], p->o[16 * sub + i] = so[8 + j];
            }
        }
    }
}

/* Unit u's two tile products (hi, lo) into C tiles CH, CL, stored to HI, LO. */
#define AMX_SUB(u, CH, CL, HI, LO)                                                             \
    do {                                                                                       \
        _tile_loadd(0, p->codes + (u) * (AMX_SUB_BYTES >> shift), 32 >> shift);                \
        _tile_loadd(1, b + ((u) >> shift) * 2 * AMX_SUB_BYTES + ((u) & shift) * 256, 64);      \
        _tile_loadd(2, b + ((u) >> shift) * 2 * AMX_SUB_BYTES + ((u) & shift) * 256 + AMX_SUB_BYTES, 64); \
        _tile_zero(CH);                                                      \
        _tile_zero(CL);                                                      \
        _tile_dpbusd(CH, 0, 1);                                              \
        _tile_dpbusd(CL, 0, 2);                                              \
        _tile_stored(CH, HI, 64);                                            \
        _tile_stored(CL, LO, 64);                                            \
    } while (0)

/* Unit u's sums (hi, lo: [weight row][activation row]) scaled into acc and off. */
static inline __attribute__((always_inline)) void amx_combine(
    const int32_t (*hi)[16], const int32_t (*lo)[16], const amx_panel *p, const float *s, int64_t u, int shift, __m512 *acc, __m512 *off) {
    const float *rec = s + AMX_ACT_FLOATS * (u >> shift);
    const __m512 dx = _mm512_load_ps(rec), dsum = _mm512_load_ps(rec + (shift ? 32 + 16 * (u & 1) : 16));
    const float *ws = p->s + 16 * u, *wo = p->o + 16 * u;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        __m512i q = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)hi[i]), 8),
                                     _mm512_load_si512((const void *)lo[i]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(dx, _mm512_set1_ps(ws[i])), acc[i]);
        off[i] = _mm512_fmadd_ps(dsum, _mm512_set1_ps(wo[i]), off[i]);
    }
}

/* Panel p against activation tile `tile`: y rows 16*tile.., columns n0 .. n0 + nr. Sub-blocks
 * alternate between two pairs of C tiles and buffers, so a sub-block's sums are scaled after the
 * next one's products are issued. Where the time goes (Intel Xeon with AMX, 2048x2048 Q8_0,
 * 256 rows, one thread: 10.6 ms against the VNNI kernel's 16.3): the tile products and stores
 * alone 5.8 ms, the scaling alone 4.1 ms, and they barely overlap. */
static void amx_panel_tile(const amx_panel *p, const amx_acts *a, int shift, int64_t tile, int64_t m, float ofs,
                           float *y, int64_t n, int64_t n0, int nr) {
    int32_t hi[2][16][16] __attribute__((aligned(64))), lo[2][16][16] __attribute__((aligned(64)));
    __m512 acc[16], off[16];
    for (int i = 0; i < 16; i++) acc[i] = off[i] = _mm512_setzero_ps();
    const int8_t *b = a->b + tile * a->subs * 2 * AMX_SUB_BYTES;
    const float *s = a->s + tile * a->subs * AMX_ACT_FLOATS;
    const int64_t units = a->subs << shift;
    int64_t j = 0;
    for (; j + 1 < units; j += 2) {
        AMX_SUB(j, 3, 4, hi[0], lo[0]);
        if (j) amx_combine(hi[1], lo[1], p, s, j - 1, shift, acc, off);
        AMX_SUB(j + 1, 5, 6, hi[1], lo[1]);
        amx_combine(hi[0], lo[0], p, s, j, shift, acc, off);
    }
    if (j < units) { /* an odd count: the last one, after the pending one */
        AMX_SUB(j, 3, 4, hi[0], lo[0]);
        if (j) amx_combine(hi[1], lo[1], p, s, j - 1, shift, acc, off);
        amx_combine(hi[0], lo[0], p, s, j, shift, acc, off);
    } else {
        amx_combine(hi[1], lo[1], p, s, j - 1, shift, acc, off);
    }
    /* acc[i] holds weight row i for the 16 activation rows: transposed here, so each output row
     * gets one store of nr floats. Stored a float at a time, the 16 rows' lines (n floats apart)
     * fell in one L1 set when n is a power of two and every write missed: Gemma 3's 4096 x 640
     * gate/up ran at 237 GFLOP/s against 345 for 1536 x 640 (2 threads, 128 rows). */
    float v[16][16] __attribute__((aligned(64)));
    for (int i = 0; i < 16; i++) _mm512_store_ps(v[i], _mm512_fnmadd_ps(_mm512_set1_ps(ofs), off[i], acc[i]));
    const int64_t rows = m - 16 * tile < 16 ? m - 16 * tile : 16;
    for (int64_t r = 0; r < rows; r++) {
        float out[16];
        for (int i = 0; i < 16; i++) out[i] = v[i][r];
        memcpy(y + (16 * tile + r) * n + n0, out, sizeof(float) * (size_t)nr);
    }
}

typedef struct {
    int t;
    const uint8_t *w;
    int64_t n, k, m;
    const amx_acts *a;
    float *y;
    int failed; /* a thread could not allocate its panel: the caller redoes the matmul */
} amx_job;

/* Panels [c0, c1) (units of 16 weight rows). */
static void amx_chunk(void *ctx, int64_t c0, int64_t c1) {
    amx_job *j = (amx_job *)ctx;
    amx_panel p;
    const int shift = amx_shift(j->t);
    if (amx_panel_alloc(&p, j->a->subs << shift, shift)) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    amx_configure(shift);
    for (int64_t c = c0; c < c1; c++) {
        const int nr = j->n - 16 * c < 16 ? (int)(j->n - 16 * c) : 16;
        switch (j->t) { /* a literal type per call, so group_codes' switch folds away */
        case T_Q4_0: amx_unpack(T_Q4_0, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q4_1: amx_unpack(T_Q4_1, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q5_0: amx_unpack(T_Q5_0, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q8_0: amx_unpack(T_Q8_0, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q4_K: amx_unpack(T_Q4_K, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        case T_Q5_K: amx_unpack(T_Q5_K, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        default: amx_unpack(T_Q6_K, j->w, 16 * c, nr, j->k, j->a->subs, &p); break;
        }
        for (int64_t tile = 0; tile < j->a->tiles; tile++)
            amx_panel_tile(&p, j->a, shift, tile, j->m, code_offset(j->t), j->y, j->n, 16 * c, nr);
    }
    _tile_release();
}

/* 0 when done on the tiles, else the caller takes the VNNI kernel. */
static int amx_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int nthreads) {
    if (m < amx_min_rows(t) || !amx_enabled()) return -1;
    amx_acts a;
    if (amx_acts_alloc(&a, m, k)) return -1;
    amx_quantize(x, m, k, &a, nthreads);
    amx_job job = {t, w, n, k, m, &a, y, 0};
    const int64_t panels = (n + 15) / 16, chunk = panels / (8 * (int64_t)(nthreads > 0 ? nthreads : 1));
    run_chunks(nthreads, m, panels, chunk > 0 ? chunk : 1, amx_chunk, &job);
    return job.failed ? -1 : 0;
}
