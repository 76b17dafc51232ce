/* qtts kernels: SnakeBeta on rows, rounded to bf16, for the bf16 vocoder step (issue 36).
 *
 *   y[t, c] = bf16( x[t, c] + inv_b[c] * sin(a[c] * x[t, c])^2 )      x: float32 or bf16 rows [T, C]
 *
 * The bf16 step (qtts/model/vocoder_step_bf16.py) keeps activations as rows (time-major, channels
 * contiguous: oneDNN's layout) and feeds each convolution a bf16 copy of the SnakeBeta of its
 * fp32 input. In torch that is six passes (mul, sin, mul, addcmul, the cast); here it is one, the
 * channels across the vector lanes. sin^2 as in snake.c (period pi, Cody-Waite reduction, odd
 * degree-13 polynomial; lanes past REDUCE_LIMIT take libm's sinf), but with separate multiplies
 * and adds, no FMA: both paths (AVX-512, and plain C compiled with -std=c11, which does not contract,
 * for every other CPU) then round identically and give the same bits. bf16 rounding is to nearest even, as
 * torch's .to(torch.bfloat16) does (NaN stays NaN).
 *
 * int qtts_snake_rows(x, x_bf16, a, inv_b, y, rows, channels, isa): 0, or -1 when the isa named is
 * unavailable. isa NULL: QTTS_KERNELS_ISA, else the best path.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sin2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ROWS_X86 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define ROWS_NEON 1
#endif

typedef void (*RowFn)(const void *x, int x_bf16, const float *a, const float *inv_b, uint16_t *y, size_t n);

static inline float load1(const void *x, int x_bf16, size_t i) {
  if (!x_bf16) return ((const float *)x)[i];
  uint32_t bits = (uint32_t)((const uint16_t *)x)[i] << 16;
  float v;
  memcpy(&v, &bits, 4);
  return v;
}

static inline uint16_t to_bf16(float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static inline float sin2_nofma(float v) {
  float n = (v * INV_PI + ROUND_MAGIC) - ROUND_MAGIC;
  float r = v - n * PI_A;
  r = r - n * PI_B;
  r = r - n * PI_C;
  float r2 = r * r;
  float p = S13 * r2 + S11;
  p = p * r2 + S9;
  p = p * r2 + S7;
  p = p * r2 + S5;
  p = p * r2 + S3;
  float s = r + (r * r2) * p;
  return s * s;
}

static inline float snake1(float x, float a, float inv_b) {
  float v = a * x;
  if (!(fabsf(v) < REDUCE_LIMIT) && !isnan(x)) {
    float s = sinf(v);
    return x + inv_b * (s * s);
  }
  return x + inv_b * sin2_nofma(v);
}

static void rows_generic(const void *x, int x_bf16, const float *a, const float *inv_b, uint16_t *y, size_t n) {
  for (size_t c = 0; c < n; ++c) y[c] = to_bf16(snake1(load1(x, x_bf16, c), a[c], inv_b[c]));
}

#ifdef ROWS_X86
__attribute__((target("avx512f,avx512bw"))) static void rows_avx512(const void *x, int x_bf16, const float *a,
                                                                   const float *inv_b, uint16_t *y, size_t n) {
  const __m512 lim = _mm512_set1_ps(REDUCE_LIMIT);
  const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  size_t c = 0;
  for (; c + 16 <= n; c += 16) {
    __m512 xv = x_bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                             _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)x + c))), 16))
                       : _mm512_loadu_ps((const float *)x + c);
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(a + c), xv);
    __m512 q = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(INV_PI)), _mm512_set1_ps(ROUND_MAGIC)),
                             _mm512_set1_ps(ROUND_MAGIC));
    __m512 r = _mm512_sub_ps(v, _mm512_mul_ps(q, _mm512_set1_ps(PI_A)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(q, _mm512_set1_ps(PI_B)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(q, _mm512_set1_ps(PI_C)));
    __m512 r2 = _mm512_mul_ps(r, r);
    __m512 p = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(S13), r2), _mm512_set1_ps(S11));
    p = _mm512_add_ps(_mm512_mul_ps(p, r2), _mm512_set1_ps(S9));
    p = _mm512_add_ps(_mm512_mul_ps(p, r2), _mm512_set1_ps(S7));
    p = _mm512_add_ps(_mm512_mul_ps(p, r2), _mm512_set1_ps(S5));
    p = _mm512_add_ps(_mm512_mul_ps(p, r2), _mm512_set1_ps(S3));
    __m512 s = _mm512_add_ps(r, _mm512_mul_ps(_mm512_mul_ps(r, r2), p));
    __m512 out = _mm512_add_ps(xv, _mm512_mul_ps(_mm512_loadu_ps(inv_b + c), _mm512_mul_ps(s, s)));
    __m512i bits = _mm512_castps_si512(out);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, round), odd), 16);
    _mm256_storeu_si256((__m256i *)(y + c), _mm512_cvtepi32_epi16(rounded));
    __mmask16 odd_lanes = _mm512_cmp_ps_mask(_mm512_abs_ps(v), lim, _CMP_GE_OQ) | _mm512_cmp_ps_mask(out, out, _CMP_UNORD_Q);
    if (odd_lanes)
      for (size_t k = c; k < c + 16; ++k) y[k] = to_bf16(snake1(load1(x, x_bf16, k), a[k], inv_b[k]));
  }
  if (c < n) rows_generic(x_bf16 ? (const void *)((const uint16_t *)x + c) : (const void *)((const float *)x + c),
                          x_bf16, a + c, inv_b + c, y + c, n - c);
}
#endif

static RowFn pick_rows(const char *isa) {
  int any = isa == NULL || *isa == '\0';
#ifdef ROWS_X86
  __builtin_cpu_init();
  if ((any || !strcmp(isa, "avx512")) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return rows_avx512;
#endif
  if (any || !strcmp(isa, "generic")) return rows_generic;
  return NULL;
}

int qtts_snake_rows(const void *x, int x_bf16, const float *a, const float *inv_b, uint16_t *y, size_t rows,
                    size_t channels, const char *isa) {
  RowFn run = pick_rows(isa ? isa : getenv("QTTS_KERNELS_ISA"));
  if (!run && !isa) run = pick_rows(NULL);
  if (!run) return -1;
  for (size_t t = 0; t < rows; ++t) {
    size_t off = t * channels;
    const void *xr = x_bf16 ? (const void *)((const uint16_t *)x + off) : (const void *)((const float *)x + off);
    run(xr, x_bf16, a, inv_b, y + off, channels);
  }
  return 0;
}
