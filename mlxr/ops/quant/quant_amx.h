/* Prompt matmuls on Intel AMX tiles (AMX-INT8), #included by quant_panel.h when the compiler
 * targets AMX (-march=native on a CPU that has it): a panel (see there) against a 16-row
 * activation tile. A tile product (TDPBUSD: u8 x s8 -> s32) takes 16 weight rows x 32 codes (A)
 * against 16 activation rows (B: 32 columns, four a row, VNNI-packed) into 16x16 int32 sums per
 * unit; the sums leave the tile per unit because each has its own scales (per weight row and
 * per activation row). Fewer than amx_min_rows(t) rows stay on the VNNI row kernel.
 * Linux grants a process the tile state on request (arch_prctl ARCH_REQ_XCOMP_PERM); when it
 * refuses, or MLXR_AMX=0, prompts take the VNNI panels. */
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

/* Unit u's two tile products (hi, lo) into C tiles CH, CL, stored to HI, LO. */
#define AMX_SUB(u, CH, CL, HI, LO)                                                             \
    do {                                                                                       \
        _tile_loadd(0, p->codes + (u) * (PANEL_SUB_BYTES >> shift), 32 >> shift);                \
        _tile_loadd(1, b + ((u) >> shift) * 2 * PANEL_SUB_BYTES + ((u) & shift) * 256, 64);      \
        _tile_loadd(2, b + ((u) >> shift) * 2 * PANEL_SUB_BYTES + ((u) & shift) * 256 + PANEL_SUB_BYTES, 64); \
        _tile_zero(CH);                                                      \
        _tile_zero(CL);                                                      \
        _tile_dpbusd(CH, 0, 1);                                              \
        _tile_dpbusd(CL, 0, 2);                                              \
        _tile_stored(CH, HI, 64);                                            \
        _tile_stored(CL, LO, 64);                                            \
    } while (0)

/* Unit u's sums (hi, lo: [weight row][activation row]) scaled into acc and off (o holds -ofs). */
static inline __attribute__((always_inline)) void amx_combine(
    const int32_t (*hi)[16], const int32_t (*lo)[16], const weight_panel *p, const float *s, int64_t u, int shift, __m512 *acc, __m512 *off) {
    const float *rec = s + PANEL_ACT_FLOATS * (u >> shift);
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
static void amx_panel_tile(const weight_panel *p, const panel_acts *a, int shift, int64_t tile, int64_t m,
                           float *y, int64_t n, int64_t n0, int nr) {
    int32_t hi[2][16][16] __attribute__((aligned(64))), lo[2][16][16] __attribute__((aligned(64)));
    __m512 acc[16], off[16];
    for (int i = 0; i < 16; i++) acc[i] = off[i] = _mm512_setzero_ps();
    const int8_t *b = a->b + tile * a->subs * 2 * PANEL_SUB_BYTES;
    const float *s = a->s + tile * a->subs * PANEL_ACT_FLOATS;
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
    /* acc[i] holds weight row i for the 16 activation rows: transposed by panel_store */
    float v[16][16] __attribute__((aligned(64)));
    for (int i = 0; i < 16; i++) _mm512_store_ps(v[i], _mm512_add_ps(acc[i], off[i]));
    panel_store(v, tile, m, y, n, n0, nr);
}
