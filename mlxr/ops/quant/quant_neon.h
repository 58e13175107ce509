/* quant_generic.h's integer sums for aarch64 with NEON: the codes of a 32-column sub-block
 * unpacked in two vectors, and per activation row the two sums over 16 columns that the
 * portable loop computes, sum(u * xq), as the same exact integers (so every result is
 * bit-identical to the portable build's).
 *
 * Baseline (armv8-a): codes widened to int16 and multiplied with xq by smull/smlal (s16 x s16
 * -> s32, 4 products a lane: < 2^26, no saturation). With the dot product extension
 * (armv8.2-a+dotprod, __ARM_FEATURE_DOTPROD) the activations are stored as their two int8 parts
 * (quantize_acts) and each part takes one sdot per 16 columns (s8 x s8 -> s32): the codes fit
 * s8 (u <= 63) except Q8_0's, which are read signed (q = u - 128) with 128 * sum(xq) added back:
 * sum(u*xq) = 256 * sum(u*hi) + sum(u*lo). */

typedef struct {
    uint8x16_t a, b; /* columns 0-15 and 16-31: u, or Q8_0's q = u - 128 in the dotprod build */
} neon_codes;

static inline uint8x16_t neon_nibbles(uint8x16_t v, int shift) {
    return vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)-shift)), vdupq_n_u8(0x0F));
}

/* 0x10 in byte l where bit `bit` of byte l of p is set. */
static inline uint8x16_t neon_bit_to_0x10(const uint8_t *p, int bit) {
    return vandq_u8(vtstq_u8(vld1q_u8(p), vdupq_n_u8((uint8_t)(1u << bit))), vdupq_n_u8(0x10));
}

/* Q5_0's fifth bits: bit l of the 16 bits at p as 0x10 in byte l. */
static inline uint8x16_t neon_bits16_to_0x10(const uint8_t *p) {
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t bytes = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
    return vandq_u8(vtstq_u8(bytes, vld1q_u8(bits)), vdupq_n_u8(0x10));
}

/* codes_scalar, 32 bytes at once. */
static inline neon_codes neon_codes_of(int t, const uint8_t *b, int j) {
    neon_codes u;
    switch (t) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0: {
        uint8x16_t q = vld1q_u8(b + (t == T_Q4_0 ? 2 : t == T_Q4_1 ? 4 : 6));
        u.a = vandq_u8(q, vdupq_n_u8(0x0F));
        u.b = vshrq_n_u8(q, 4);
        if (t == T_Q5_0) {
            u.a = vorrq_u8(u.a, neon_bits16_to_0x10(b + 2));
            u.b = vorrq_u8(u.b, neon_bits16_to_0x10(b + 4));
        }
        break;
    }
    case T_Q8_0:
#ifdef MLXR_NEON_DOT
        u.a = vld1q_u8(b + 2);
        u.b = vld1q_u8(b + 18);
#else
        u.a = veorq_u8(vld1q_u8(b + 2), vdupq_n_u8(0x80));
        u.b = veorq_u8(vld1q_u8(b + 18), vdupq_n_u8(0x80));
#endif
        break;
    case T_Q4_K:
    case T_Q5_K: {
        const uint8_t *q = b + (t == T_Q4_K ? 16 : 48) + 32 * (j / 2);
        u.a = neon_nibbles(vld1q_u8(q), 4 * (j & 1));
        u.b = neon_nibbles(vld1q_u8(q + 16), 4 * (j & 1));
        if (t == T_Q5_K) {
            u.a = vorrq_u8(u.a, neon_bit_to_0x10(b + 16, j));
            u.b = vorrq_u8(u.b, neon_bit_to_0x10(b + 32, j));
        }
        break;
    }
    default: { /* Q6_K: sub-block j = 4h + s */
        int h = j / 4, s = j % 4;
        const uint8_t *ql = b + 64 * h + 32 * (s & 1), *qh = b + 128 + 32 * h;
        const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * s));
        const uint8x16_t three = vdupq_n_u8(3);
        u.a = vorrq_u8(neon_nibbles(vld1q_u8(ql), 4 * (s >> 1)),
                       vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh), shift), three), 4));
        u.b = vorrq_u8(neon_nibbles(vld1q_u8(ql + 16), 4 * (s >> 1)),
                       vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16), shift), three), 4));
    }
    }
    return u;
}

#ifdef MLXR_NEON_DOT
/* sum(u * (256*hi + lo)) over 16 columns: hi and lo are 16 int8 each. */
static inline int32_t neon_sum16(uint8x16_t u, const int8_t *hi, const int8_t *lo) {
    int8x16_t c = vreinterpretq_s8_u8(u);
    int32x4_t acc = vshlq_n_s32(vdotq_s32(vdupq_n_s32(0), c, vld1q_s8(hi)), 8);
    return vaddvq_s32(vdotq_s32(acc, c, vld1q_s8(lo)));
}

/* The portable loop's p0, p1 for one row: xq's 32 columns are stored as hi[32], lo[32]
 * (quantize_acts); s16 the row's sums of xq per 16 columns (Q8_0's signed codes). */
static inline void neon_sums(int t, neon_codes u, const int16_t *xq, const int32_t *s16, int32_t *p0, int32_t *p1) {
    const int8_t *hi = (const int8_t *)xq, *lo = hi + 32;
    *p0 = neon_sum16(u.a, hi, lo);
    *p1 = neon_sum16(u.b, hi + 16, lo + 16);
    if (t == T_Q8_0) {
        *p0 += 128 * s16[0];
        *p1 += 128 * s16[1];
    }
}
#else
/* sum(u * xq) over 16 columns. */
static inline int32_t neon_sum16(uint8x16_t u, const int16_t *xq) {
    int16x8_t c0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(u))), c1 = vreinterpretq_s16_u16(vmovl_high_u8(u));
    int16x8_t x0 = vld1q_s16(xq), x1 = vld1q_s16(xq + 8);
    int32x4_t acc = vmull_s16(vget_low_s16(c0), vget_low_s16(x0));
    acc = vmlal_high_s16(acc, c0, x0);
    acc = vmlal_s16(acc, vget_low_s16(c1), vget_low_s16(x1));
    return vaddvq_s32(vmlal_high_s16(acc, c1, x1));
}

static inline void neon_sums(int t, neon_codes u, const int16_t *xq, const int32_t *s16, int32_t *p0, int32_t *p1) {
    (void)t;
    (void)s16;
    *p0 = neon_sum16(u.a, xq);
    *p1 = neon_sum16(u.b, xq + 16);
}
#endif
