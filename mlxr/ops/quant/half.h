/* IEEE fp16 (little-endian bytes, as GGUF blocks store their scales) to float32, exact for
   every value including subnormals, infinities and NaN: shared by quant.c and quant_extra.c. */
#ifndef MLXR_HALF_H
#define MLXR_HALF_H

#include <stdint.h>
#include <string.h>

static inline float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) {
        f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

#endif
