/* Research prototype: AVX2 int4-weight x int8-activation GEMV with a tiled, strictly sequential
 * weight layout (4 rows x 64 k per 128-byte tile; byte i of a row's 32 bytes holds k = 64t + i in
 * its low nibble and k = 64t + 32 + i in its high nibble; tiles ordered [n/4][k/64]), unsigned
 * nibbles (0..15, zero point 8) times int8 activations with maddubs, int16 sums over one block,
 * one madd per block, fp32 scale per (row, block), the zero point removed with a per-block
 * activation sum. Checks the result against fp32 and times 1 and 2 threads (OpenMP over tiles).
 * Build/run: gcc -O3 -mavx2 -mfma -fopenmp q4tile.c -o q4tile -lm && ./q4tile [block]
 * Compare: benchmarks/perf/matmulnbits_micro.py --threads 1|2 --variants q4b128l4 (same shapes).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { int n, k, blk; uint8_t *w; float *s; } qmat;   /* s: [n/4][k/blk][4] */

static double wall(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static void pack(qmat *m, const float *wf) {    /* wf: [n][k] row-major, symmetric int4 per block */
  int n = m->n, k = m->k, blk = m->blk, nb = k / blk;
  m->w = aligned_alloc(64, (size_t)n * k / 2); m->s = aligned_alloc(64, (size_t)n * nb * 4 + 64);
  uint8_t *q = malloc(k);
  for (int r = 0; r < n; ++r) {
    for (int b = 0; b < nb; ++b) {
      float amax = 0; for (int i = 0; i < blk; ++i) amax = fmaxf(amax, fabsf(wf[(size_t)r * k + b * blk + i]));
      float sc = amax / 7.0f; if (sc == 0) sc = 1;
      m->s[((size_t)(r / 4) * nb + b) * 4 + r % 4] = sc;
      for (int i = 0; i < blk; ++i) { int v = (int)lrintf(wf[(size_t)r * k + b * blk + i] / sc); v = v < -8 ? -8 : v > 7 ? 7 : v; q[b * blk + i] = (uint8_t)(v + 8); }
    }
    for (int t = 0; t < k / 64; ++t) {
      uint8_t *dst = m->w + ((size_t)(r / 4) * (k / 64) + t) * 128 + (r % 4) * 32;
      for (int i = 0; i < 32; ++i) dst[i] = q[64 * t + i] | (q[64 * t + 32 + i] << 4);
    }
  }
  free(q);
}

static void quant_x(const float *x, int k, int blk, int8_t *xq, float *xs, int *xsum) {
  for (int b = 0; b < k / blk; ++b) {
    float amax = 0; for (int i = 0; i < blk; ++i) amax = fmaxf(amax, fabsf(x[b * blk + i]));
    float sc = amax / 127.0f; if (sc == 0) sc = 1; xs[b] = sc; int sum = 0;
    for (int i = 0; i < blk; ++i) { int v = (int)lrintf(x[b * blk + i] / sc); xq[b * blk + i] = (int8_t)v; sum += v; }
    xsum[b] = sum;
  }
}

static void gemv_tiles(const qmat *m, const int8_t *xq, const float *xs, const int *xsum, float *y, int t0, int t1) {
  const int k = m->k, blk = m->blk, nb = k / blk, per = blk / 64;
  const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0f);
  for (int rt = t0; rt < t1; ++rt) {
    const uint8_t *w = m->w + (size_t)rt * (k / 64) * 128;
    const float *s = m->s + (size_t)rt * nb * 4;
    __m128 acc = _mm_setzero_ps(), corr = _mm_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
      for (int t = 0; t < per; ++t) {
        const int off = b * blk + t * 64;
        const uint8_t *p = w + (size_t)(off / 64) * 128;
        _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + off)), x1 = _mm256_loadu_si256((const __m256i *)(xq + off + 32));
        __m256i r0 = _mm256_load_si256((const __m256i *)p), r1 = _mm256_load_si256((const __m256i *)(p + 32));
        __m256i r2 = _mm256_load_si256((const __m256i *)(p + 64)), r3 = _mm256_load_si256((const __m256i *)(p + 96));
#define ACC(a, r) a = _mm256_add_epi16(a, _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(r, lo4), x0), \
                         _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r, 4), lo4), x1)))
        ACC(a0, r0); ACC(a1, r1); ACC(a2, r2); ACC(a3, r3);
      }
      /* horizontal: 4 rows' int16 sums -> int32 -> one __m128 of 4 row sums */
      __m256i s0 = _mm256_madd_epi16(a0, ones), s1 = _mm256_madd_epi16(a1, ones);
      __m256i s2 = _mm256_madd_epi16(a2, ones), s3 = _mm256_madd_epi16(a3, ones);
      __m256i h01 = _mm256_hadd_epi32(s0, s1), h23 = _mm256_hadd_epi32(s2, s3);
      __m256i h = _mm256_hadd_epi32(h01, h23);                   /* [r0 r1 r2 r3 | r0 r1 r2 r3] partial */
      __m128i hs = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      __m128 sc = _mm_mul_ps(_mm_load_ps(s + b * 4), _mm_set1_ps(xs[b]));
      acc = _mm_fmadd_ps(sc, _mm_cvtepi32_ps(hs), acc);
      corr = _mm_fmadd_ps(sc, _mm_set1_ps(8.0f * (float)xsum[b]), corr);
    }
    _mm_storeu_ps(y + rt * 4, _mm_sub_ps(acc, corr));
  }
}

static void gemv(const qmat *m, const int8_t *xq, const float *xs, const int *xsum, float *y, int threads) {
  int tiles = m->n / 4;
  if (threads <= 1) { gemv_tiles(m, xq, xs, xsum, y, 0, tiles); return; }
#pragma omp parallel num_threads(threads)
  {
    int id = omp_get_thread_num(), nt = omp_get_num_threads();
    gemv_tiles(m, xq, xs, xsum, y, tiles * id / nt, tiles * (id + 1) / nt);
  }
}

int main(int argc, char **argv) {
  int blk = argc > 1 ? atoi(argv[1]) : 128;
  if (blk < 64 || blk % 64 || blk > 256) { fprintf(stderr, "block must be 64, 128 or 256 (the int16 sums overflow above 256)\n"); return 2; }
  /* predictor step: 5 x (qkv 1024->4096, o 2048->1024, gate_up 1024->6144, down 3072->1024) + head 1024->2048 */
  int shapes[21][2]; for (int l = 0; l < 20; ++l) { int s4[4][2] = {{1024, 4096}, {2048, 1024}, {1024, 6144}, {3072, 1024}}; shapes[l][0] = s4[l % 4][0]; shapes[l][1] = s4[l % 4][1]; }
  shapes[20][0] = 1024; shapes[20][1] = 2048;
  qmat m[21]; size_t params = 0; float *x = malloc(8192 * 4), *y = malloc(8192 * 4);
  int8_t *xq = aligned_alloc(64, 8192); float *xs = malloc(8192 * 4); int *xsum = malloc(8192 * 4);
  srand(1); for (int i = 0; i < 8192; ++i) x[i] = (rand() / (float)RAND_MAX - 0.5f);
  double worst = 0;
  for (int l = 0; l < 21; ++l) {
    int k = shapes[l][0], n = shapes[l][1]; m[l].n = n; m[l].k = k; m[l].blk = blk;
    float *wf = malloc((size_t)n * k * 4); for (size_t i = 0; i < (size_t)n * k; ++i) wf[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.05f;
    pack(&m[l], wf); params += (size_t)n * k;
    if (l < 4) {   /* check against fp32 with the dequantized weights (quantization of x is the only error) */
      quant_x(x, k, blk, xq, xs, xsum); gemv(&m[l], xq, xs, xsum, y, 1);
      double num = 0, den = 0;
      for (int r = 0; r < n; ++r) {
        double acc = 0;
        for (int i = 0; i < k; ++i) {
          const uint8_t *t = m[l].w + ((size_t)(r / 4) * (k / 64) + i / 64) * 128 + (r % 4) * 32;
          int j = i % 64, q = j < 32 ? (t[j] & 15) : (t[j - 32] >> 4);
          acc += (double)(q - 8) * m[l].s[((size_t)(r / 4) * (k / blk) + i / blk) * 4 + r % 4] * x[i];
        }
        num += (acc - y[r]) * (acc - y[r]); den += acc * acc;
      }
      double snr = 10 * log10(den / num); if (l == 0 || snr < worst) worst = snr;
    }
    free(wf);
  }
  printf("block %d: output SNR vs fp32 activations (int8 activation error only): %.1f dB\n", blk, worst);
  for (int threads = 1; threads <= 2; ++threads) {
    double best = 1e9;
    for (int rep = 0; rep < 40; ++rep) {
      double t0 = wall();
      for (int l = 0; l < 21; ++l) { quant_x(x, m[l].k, blk, xq, xs, xsum); gemv(&m[l], xq, xs, xsum, y, threads); }
      double t = wall() - t0; if (t < best) best = t;
    }
    printf("  %d thread(s): %.1f M params in %.2f ms (best of 40, wall) -> %.1f Gparam/s, %.1f GB/s int4\n",
           threads, params / 1e6, best * 1e3, params / best / 1e9, params / 2.0 / best / 1e9);
  }
  return 0;
}
