/* Prototype (issue 24): an AVX-512 VNNI GEMV on MatMulNBits' own weight layout, to see whether a
 * kernel of our own beats onnxruntime's MatMulNBits (bits 8/4, block 128, accuracy_level 4) here.
 *
 * Layout (com.microsoft MatMulNBits, as src/qtts/export/quantize.py writes it): B [N][K/blk][blk*bits/8]
 * uint8 codes (8 bits: one byte per k; 4 bits: byte j holds k = 2j in its low nibble, 2j+1 in the
 * high one), scales [N][K/blk] fp32, zero point 2^(bits-1) (128 / 8) when no zero_points input.
 * Activations: int8 per block of K as accuracy_level 4 does (scale = absmax / 127, round to
 * nearest even). vpdpbusd multiplies the unsigned codes by the signed activations; the zero point
 * is removed afterwards with the block sums of the quantized activations:
 *     y[n] = sum_b  s[n,b] * xs[b] * (sum_k u[n,k] * xq[k]  -  zp * sum_k xq[k])
 * One row at a time (an fp32 accumulator of 16 lanes, one horizontal sum per row), so the weights
 * are read as one strictly sequential stream. The generic path (any block that is a multiple of 128;
 * forced with the environment variable Q8VNNI_GENERIC=1) can interleave rows: built with -DROWS=2, 4
 * or 8 it measured ~3x SLOWER on this Zen 4 VM (6.6-8.5 GB/s instead of 21-33 for one row), the
 * hardware prefetcher loses the interleaved streams. The block-128 path precomputes the broadcast
 * activation scales and does the zero-point term as one masked dot product per row.
 *
 * Built as a shared library and driven through ctypes by benchmarks/perf/gemv_vnni.py (same weights as
 * onnxruntime's session, interleaved timing):
 *     gcc -O3 -mavx512f -mavx512bw -mavx512vnni -mfma -fopenmp -shared -fPIC q8vnni.c -o libq8vnni.so
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* x[k] -> xq[kb*blk] (zero-padded; 4 bits: per block the even k first, then the odd k), xs, xsum */
static void quant_act(const float *x, int k, int blk, int bits, int8_t *xq, float *xs, int32_t *xsum) {
  const int kb = (k + blk - 1) / blk;
  for (int b = 0; b < kb; ++b) {
    const int k0 = b * blk, len = k - k0 < blk ? k - k0 : blk;
    float amax = 0.0f;
    for (int j = 0; j < len; ++j) amax = fmaxf(amax, fabsf(x[k0 + j]));
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < blk; ++j) {
      const int q = j < len ? (int)nearbyintf(x[k0 + j] * inv) : 0;
      const int at = bits == 8 ? j : (j & 1) * (blk / 2) + j / 2;
      xq[k0 + at] = (int8_t)q;
      s += q;
    }
    xs[b] = amax / 127.0f;
    xsum[b] = s;
  }
}

static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

#ifndef ROWS
#define ROWS 1
#endif
static void rows_q8(const uint8_t *B, const float *S, const int8_t *xq, const float *xs, const int32_t *xsum,
                    float *y, int r0, int r1, int kb, int blk) {
  const size_t rb = (size_t)kb * blk; /* bytes per row */
  int r = r0;
  for (; r + ROWS <= r1; r += ROWS) {
    __m512 f[ROWS];
    float corr[ROWS] = {0};
    for (int i = 0; i < ROWS; ++i) f[i] = _mm512_setzero_ps();
    for (int b = 0; b < kb; ++b) {
      __m512i a[ROWS];
      for (int i = 0; i < ROWS; ++i) a[i] = _mm512_setzero_si512();
      for (int j = 0; j < blk; j += 64) {
        const __m512i xv = _mm512_loadu_si512(xq + b * blk + j);
        for (int i = 0; i < ROWS; ++i)
          a[i] = _mm512_dpbusd_epi32(a[i], _mm512_loadu_si512(B + (r + i) * rb + b * blk + j), xv);
      }
      for (int i = 0; i < ROWS; ++i) {
        const float sc = S[(size_t)(r + i) * kb + b] * xs[b];
        f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i]), _mm512_set1_ps(sc), f[i]);
        corr[i] += sc * (float)(128 * xsum[b]);
      }
    }
    for (int i = 0; i < ROWS; ++i) y[r + i] = hsum(f[i]) - corr[i];
  }
  for (; r < r1; ++r) { /* tail rows */
    float acc = 0.0f;
    for (int b = 0; b < kb; ++b) {
      int32_t d = 0;
      for (int j = 0; j < blk; ++j) d += (int32_t)B[r * rb + b * blk + j] * xq[b * blk + j];
      acc += S[(size_t)r * kb + b] * xs[b] * (float)(d - 128 * xsum[b]);
    }
    y[r] = acc;
  }
}

static void rows_q4(const uint8_t *B, const float *S, const int8_t *xq, const float *xs, const int32_t *xsum,
                    float *y, int r0, int r1, int kb, int blk) {
  const size_t rb = (size_t)kb * blk / 2;
  const __m512i lo4 = _mm512_set1_epi8(0x0f);
  int r = r0;
  for (; r + ROWS <= r1; r += ROWS) {
    __m512 f[ROWS];
    float corr[ROWS] = {0};
    for (int i = 0; i < ROWS; ++i) f[i] = _mm512_setzero_ps();
    for (int b = 0; b < kb; ++b) {
      __m512i a[ROWS];
      for (int i = 0; i < ROWS; ++i) a[i] = _mm512_setzero_si512();
      for (int j = 0; j < blk; j += 128) {
        const __m512i xe = _mm512_loadu_si512(xq + b * blk + j / 2), xo = _mm512_loadu_si512(xq + b * blk + blk / 2 + j / 2);
        for (int i = 0; i < ROWS; ++i) {
          const __m512i w = _mm512_loadu_si512(B + (r + i) * rb + (b * blk + j) / 2);
          a[i] = _mm512_dpbusd_epi32(a[i], _mm512_and_si512(w, lo4), xe);
          a[i] = _mm512_dpbusd_epi32(a[i], _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4), xo);
        }
      }
      for (int i = 0; i < ROWS; ++i) {
        const float sc = S[(size_t)(r + i) * kb + b] * xs[b];
        f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i]), _mm512_set1_ps(sc), f[i]);
        corr[i] += sc * (float)(8 * xsum[b]);
      }
    }
    for (int i = 0; i < ROWS; ++i) y[r + i] = hsum(f[i]) - corr[i];
  }
  for (; r < r1; ++r) {
    float acc = 0.0f;
    for (int b = 0; b < kb; ++b) {
      int32_t d = 0;
      for (int j = 0; j < blk; ++j) {
        const uint8_t byte = B[r * rb + (b * blk + j) / 2];
        d += (int32_t)((j & 1) ? byte >> 4 : byte & 15) * xq[b * blk + (j & 1) * (blk / 2) + j / 2];
      }
      acc += S[(size_t)r * kb + b] * xs[b] * (float)(d - 8 * xsum[b]);
    }
    y[r] = acc;
  }
}

/* Block 128, the shipped layout: per block 2 (8-bit) or 1 (4-bit) 64-byte weight loads, vpdpbusd,
 * one cvt + fma with the broadcast row scale times a precomputed broadcast of the activation scale;
 * the zero-point term is one masked 16-lane dot product of the row's scales per row. */
static inline float corr_dot(const float *s, const float *cz, int kb) {
  __m512 c = _mm512_setzero_ps();
  for (int b = 0; b < kb; b += 16) {
    const __mmask16 m = kb - b >= 16 ? 0xffff : (__mmask16)((1u << (kb - b)) - 1);
    c = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, s + b), _mm512_maskz_loadu_ps(m, cz + b), c);
  }
  return _mm512_reduce_add_ps(c);
}

static void rows_q8_128(const uint8_t *B, const float *S, const int8_t *xq, const __m512 *xsv, const float *cz,
                        float *y, int r0, int r1, int kb) {
  for (int r = r0; r < r1; ++r) {
    const uint8_t *w = B + (size_t)r * kb * 128;
    const float *s = S + (size_t)r * kb;
    __m512 f = _mm512_setzero_ps();
    for (int b = 0; b < kb; ++b) {
      __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(w + b * 128),
                                      _mm512_load_si512(xq + b * 128));
      a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(w + b * 128 + 64), _mm512_load_si512(xq + b * 128 + 64));
      f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(_mm512_set1_ps(s[b]), xsv[b]), f);
    }
    y[r] = _mm512_reduce_add_ps(f) - corr_dot(s, cz, kb);
  }
}

static void rows_q4_128(const uint8_t *B, const float *S, const int8_t *xq, const __m512 *xsv, const float *cz,
                        float *y, int r0, int r1, int kb) {
  const __m512i lo4 = _mm512_set1_epi8(0x0f);
  for (int r = r0; r < r1; ++r) {
    const uint8_t *w = B + (size_t)r * kb * 64;
    const float *s = S + (size_t)r * kb;
    __m512 f = _mm512_setzero_ps();
    for (int b = 0; b < kb; ++b) {
      const __m512i v = _mm512_loadu_si512(w + b * 64);
      __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, lo4), _mm512_load_si512(xq + b * 128));
      a = _mm512_dpbusd_epi32(a, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4), _mm512_load_si512(xq + b * 128 + 64));
      f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(_mm512_set1_ps(s[b]), xsv[b]), f);
    }
    y[r] = _mm512_reduce_add_ps(f) - corr_dot(s, cz, kb);
  }
}

/* y[n] = x[k] @ W^T; bits 8 or 4, blk 128 (a multiple of 128), threads >= 1 (OpenMP over rows) */
int qgemv(const float *x, int k, int n, const uint8_t *B, const float *S, float *y, int bits, int blk, int threads) {
  if (blk % 128 || (bits != 8 && bits != 4)) return 1;
  const int kb = (k + blk - 1) / blk;
  int8_t xq[16384] __attribute__((aligned(64)));
  float xs[128];
  int32_t xsum[128];
  if (kb * blk > 16384) return 2;
  quant_act(x, k, blk, bits, xq, xs, xsum);
  __m512 xsv[128];
  float cz[128];
  for (int b = 0; b < kb; ++b) {
    xsv[b] = _mm512_set1_ps(xs[b]);
    cz[b] = xs[b] * (float)((bits == 8 ? 128 : 8) * xsum[b]);
  }
  const int fast = blk == 128 && !getenv("Q8VNNI_GENERIC");
  const int tiles = (n + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int t = 0; t < tiles; ++t) {
    const int r0 = t * 16, r1 = r0 + 16 < n ? r0 + 16 : n;
    if (fast && bits == 8) rows_q8_128(B, S, xq, xsv, cz, y, r0, r1, kb);
    else if (fast) rows_q4_128(B, S, xq, xsv, cz, y, r0, r1, kb);
    else if (bits == 8) rows_q8(B, S, xq, xs, xsum, y, r0, r1, kb, blk);
    else rows_q4(B, S, xq, xs, xsum, y, r0, r1, kb, blk);
  }
  return 0;
}
