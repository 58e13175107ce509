/* Runs mlxr's quant kernels as built for another machine (tests/kernels/test_cpu_kernels_aarch64.py builds
 * this with the sources for aarch64 and runs it under qemu). stdin: int32 type, n, k, row bytes,
 * library (0: quant.c's core types, 1: quant_extra.c's), count of products c, then c row counts
 * m, then n * row_bytes weight bytes and, per product, m * k floats; stdout: int32 quant.c's
 * mlxr_simd_level, the n * k dequantized floats, then each m * n product. Exit 2 on a short
 * read, 3 on a kernel's refusal. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void mlxr_dequant_f32(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int nthreads);
int mlxr_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int nthreads);
int mlxr_simd_level(void);
void mlxr_extra_dequant_f32(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int nthreads);
void mlxr_extra_qmatmul(int t, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                        int nthreads);

static void *read_all(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p || fread(p, 1, bytes, stdin) != bytes) exit(2);
    return p;
}

int main(void) {
    int32_t head[6]; /* type, n, k, row bytes, library, products */
    if (fread(head, sizeof head, 1, stdin) != 1 || head[5] < 0) return 2;
    int t = head[0], extra = head[4], count = head[5];
    int64_t n = head[1], k = head[2], row_bytes = head[3];
    int32_t *rows = read_all(sizeof(int32_t) * (size_t)count);
    uint8_t *w = read_all((size_t)(n * row_bytes));
    float *deq = malloc(sizeof(float) * (size_t)(n * k));
    int32_t level = mlxr_simd_level();
    if (extra) mlxr_extra_dequant_f32(t, w, n, k, deq, 2);
    else mlxr_dequant_f32(t, w, n, k, deq, 2);
    fwrite(&level, sizeof level, 1, stdout);
    fwrite(deq, sizeof(float), (size_t)(n * k), stdout);
    for (int i = 0; i < count; i++) {
        int64_t m = rows[i];
        float *x = read_all(sizeof(float) * (size_t)(m * k)), *y = malloc(sizeof(float) * (size_t)(m * n));
        if (extra) mlxr_extra_qmatmul(t, w, n, k, x, m, y, 2);
        else if (mlxr_qmatmul(t, w, n, k, x, m, y, 2)) return 3;
        fwrite(y, sizeof(float), (size_t)(m * n), stdout);
        free(x);
        free(y);
    }
    return 0;
}
