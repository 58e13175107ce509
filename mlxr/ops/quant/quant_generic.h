/* The matmul of quant.c for builds without AVX-512 VNNI: portable C, AVX2 (most laptops and
 * desktops, and AVX-512 CPUs without VNNI) where the build has it, and NEON on aarch64
 * (quant_neon.h: the portable loop's integer sums, bit-identical). Included by quant.c, which
 * defines the block tables, h2f, scale_min_k4, quant32 and ROW_TILE before it.
 *
 * The activations are kept as one int16 per column, xq = 256*hi + lo (|xq| <= 32639), so a
 * code u <= 255 times xq fits pmaddwd (u16 x s16 -> s32, pairs summed: < 2^24) exactly, for
 * every type, with no saturation: AVX2 runs two pmaddwd per 32 columns and row, the portable
 * build's loop is the same products in C (which compilers turn into pmaddwd too). */
typedef struct {
    int16_t *x;   /* m * k: 256*hi + lo (NEON dotprod build: per 32 columns hi[32] then lo[32]) */
    float *d;     /* m * k/32: the unit of each 32 columns */
    int32_t *s16; /* m * k/16: sums of xq per 16 columns (for the weights' offsets) */
    int64_t k;
} acts_t;

static int acts_alloc(acts_t *a, int64_t m, int64_t k) {
    a->k = k;
    a->x = (int16_t *)scratch(0, (size_t)(2 * m * k) + 1);
    a->d = (float *)scratch(1, sizeof(float) * (size_t)(m * (k / 32) + 1));
    a->s16 = (int32_t *)scratch(2, sizeof(int32_t) * (size_t)(m * (k / 16) + 1));
    return a->x && a->d && a->s16 ? 0 : -1;
}

static void quantize_acts(const float *x, int64_t m, int64_t k, acts_t *a, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (m >= 2 * ROW_TILE)
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < k / 32; b++) {
            int8_t hi[32], lo[32];
            int16_t *xq = a->x + r * k + 32 * b;
            a->d[r * (k / 32) + b] = quant32(x + r * k + 32 * b, hi, lo, a->s16 + r * (k / 16) + 2 * b);
#ifdef MLXR_NEON_DOT /* the two parts as they are, for sdot: hi[32], lo[32] in xq's 64 bytes */
            memcpy(xq, hi, 32);
            memcpy((int8_t *)xq + 32, lo, 32);
#else
            for (int i = 0; i < 32; i++) xq[i] = (int16_t)(256 * hi[i] + lo[i]);
#endif
        }
}

/* Scales and offsets of one block's 16-column groups: w = s[g]*u - o[g]. */
static inline int block_header(int t, const uint8_t *b, float *s, float *o) {
    switch (t) {
    case T_Q4_0: { float d = h2f(b); s[0] = s[1] = d; o[0] = o[1] = 8.0f * d; return 1; }
    case T_Q5_0: { float d = h2f(b); s[0] = s[1] = d; o[0] = o[1] = 16.0f * d; return 1; }
    case T_Q4_1: { s[0] = s[1] = h2f(b); o[0] = o[1] = -h2f(b + 2); return 1; }
    case T_Q8_0: { float d = h2f(b); s[0] = s[1] = d; o[0] = o[1] = 128.0f * d; return 1; }
    case T_Q4_K:
    case T_Q5_K: {
        float d = h2f(b), dmin = h2f(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, b + 4, &sc, &m);
            s[2 * j] = s[2 * j + 1] = d * (float)sc;
            o[2 * j] = o[2 * j + 1] = dmin * (float)m;
        }
        return 8;
    }
    default: { /* Q6_K */
        float d = h2f(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int g = 0; g < 16; g++) { s[g] = d * (float)sc[g]; o[g] = 32.0f * s[g]; }
        return 8;
    }
    }
}

/* The unsigned codes u of sub-block j (32 columns) of a block. */
static inline void codes_scalar(int t, const uint8_t *b, int j, uint8_t *u) {
    for (int l = 0; l < 32; l++) {
        int e, v;
        switch (t) {
        case T_Q4_0: v = l < 16 ? (b[2 + l] & 0xF) : (b[2 + l - 16] >> 4); break;
        case T_Q4_1: v = l < 16 ? (b[4 + l] & 0xF) : (b[4 + l - 16] >> 4); break;
        case T_Q5_0: {
            uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
            v = (l < 16 ? (b[6 + l] & 0xF) : (b[6 + l - 16] >> 4)) | (((qh >> l) & 1) << 4);
            break;
        }
        case T_Q8_0: v = b[2 + l] ^ 0x80; break;
        case T_Q4_K: v = (b[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF; break;
        case T_Q5_K: v = ((b[48 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF) | (((b[16 + l] >> j) & 1) << 4); break;
        default:
            e = 32 * j + l;
            {
                int h = e / 128, s = (e % 128) / 32;
                v = ((b[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0xF) | (((b[128 + 32 * h + l] >> (2 * s)) & 3) << 4);
            }
        }
        u[l] = (uint8_t)v;
    }
}

#ifdef MLXR_NEON
#include "quant_neon.h"
#endif

#ifdef MLXR_AVX2
static inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }

/* Bit l of the 32-bit word at p, for l = 0..31, as 0x10 or 0 in byte l (Q5_0's fifth bits). */
static inline __m256i bits_to_0x10(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w), spread);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* codes_scalar, 32 bytes at once. */
static inline __m256i codes32(int t, const uint8_t *b, int j) {
    switch (t) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0: {
        __m128i q = _mm_loadu_si128((const __m128i *)(b + (t == T_Q4_0 ? 2 : t == T_Q4_1 ? 4 : 6)));
        __m256i u = low_nibbles(_mm256_set_m128i(_mm_srli_epi16(q, 4), q));
        return t == T_Q5_0 ? _mm256_or_si256(u, bits_to_0x10(b + 2)) : u;
    }
    case T_Q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
    case T_Q4_K:
    case T_Q5_K: {
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + (t == T_Q4_K ? 16 : 48) + 32 * (j / 2)));
        __m256i u = low_nibbles(_mm256_srli_epi16(q, 4 * (j & 1)));
        if (t == T_Q4_K) return u;
        __m256i h = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(b + 16)), j), _mm256_set1_epi8(1));
        return _mm256_or_si256(u, _mm256_slli_epi16(h, 4));
    }
    default: { /* Q6_K: sub-block j = 4h + s */
        int h = j / 4, s = j % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (s & 1)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i lo = low_nibbles(_mm256_srli_epi16(ql, 4 * (s >> 1)));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

/* Rows [m0, m0+mr) of activations against one weight row over columns [k0, k1) (multiples
 * of 256, or k1 = k; the activations' k is a->k). */
static inline __attribute__((always_inline)) void dot_rows(
    int t, const uint8_t *wrow, int64_t k0, int64_t k1, const acts_t *a, int64_t m0, int mr, float *out) {
    const int be = BLOCK_ELEMS[t], bb = BLOCK_BYTES[t];
    const int64_t k = a->k, nb = k1 / be, n32 = k / 32;
    float s[16], o[16], off[ROW_TILE] = {0};
#ifdef MLXR_AVX2
    __m256 acc[ROW_TILE];
    for (int r = 0; r < mr; r++) acc[r] = _mm256_setzero_ps();
#else
    float accs[ROW_TILE] = {0};
#ifdef MLXR_NEON
    neon_codes u;
#else
    uint8_t u[32];
#endif
#endif
    for (int64_t ib = k0 / be; ib < nb; ib++) {
        const uint8_t *blk = wrow + ib * bb;
        int subs = block_header(t, blk, s, o);
        for (int j = 0; j < subs; j++) {
            int64_t c = ib * (be / 32) + j; /* 32-column index in the row */
#ifdef MLXR_AVX2
            __m256i u8 = codes32(t, blk, j);
            __m256i u0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u8)), u1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(u8, 1));
#elif defined(MLXR_NEON)
            u = neon_codes_of(t, blk, j);
#else
            codes_scalar(t, blk, j, u);
#endif
            for (int r = 0; r < mr; r++) {
                int64_t row = m0 + r;
                float dx = a->d[row * n32 + c];
                const int32_t *s16 = a->s16 + row * 2 * n32 + 2 * c;
                const int16_t *xq = a->x + row * k + 32 * c;
                off[r] += dx * (o[2 * j] * (float)s16[0] + o[2 * j + 1] * (float)s16[1]);
#ifdef MLXR_AVX2
                __m256i p0 = _mm256_madd_epi16(u0, _mm256_loadu_si256((const __m256i *)xq));
                __m256i p1 = _mm256_madd_epi16(u1, _mm256_loadu_si256((const __m256i *)(xq + 16)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(dx * s[2 * j]), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(dx * s[2 * j + 1]), acc[r]);
#else
                int32_t p0 = 0, p1 = 0;
#ifdef MLXR_NEON
                neon_sums(t, u, xq, s16, &p0, &p1);
#else
                for (int l = 0; l < 16; l++) p0 += (int32_t)u[l] * xq[l];
                for (int l = 16; l < 32; l++) p1 += (int32_t)u[l] * xq[l];
#endif
                accs[r] += dx * (s[2 * j] * (float)p0 + s[2 * j + 1] * (float)p1);
#endif
            }
        }
    }
#ifdef MLXR_AVX2
    for (int r = 0; r < mr; r++) out[r] = hsum8(acc[r]) - off[r];
#else
    for (int r = 0; r < mr; r++) out[r] = accs[r] - off[r];
#endif
}
