/* Prototype: how fast can an AVX2 int4-weight x int8-activation GEMV go on this CPU?
 * (the MatMulNBits accuracy_level 4 contract: symmetric 4-bit weight blocks along K with an fp32
 * scale each, activations quantized to int8 per block). Layout: row-major [N][K/2] nibbles
 * (low nibble = even k), scales [N][K/BLK]. Block 32 (ggml q4_0 x q8_0 style) accumulates in fp32
 * per block; BLK=128 accumulates 4 sub-blocks in int32 first. 1 thread; time = min of reps.
 * Build/run: gcc -O3 -mavx2 -mfma q4gemv.c -o q4gemv && ./q4gemv
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static inline __m256i nibbles32(const uint8_t *p) {  /* 16 bytes -> 32 int8 in [-8, 7] */
  __m128i b = _mm_loadu_si128((const __m128i *)p);
  __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
  return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* y[n] = sum_b  ws[n,b] * xs[b] * sum_{k in b} wq[n,k] * xq[k] */
static void gemv_q4(const uint8_t *w, const float *ws, const int8_t *xq, const float *xs,
                    float *y, int n, int k, int blk) {
  const int nb = k / blk, sub = blk / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < n; ++r) {
    const uint8_t *wr = w + (size_t)r * k / 2;
    const float *sr = ws + (size_t)r * nb;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      __m256i iacc = _mm256_setzero_si256();
      for (int s = 0; s < sub; ++s) {
        const int off = b * blk + s * 32;
        /* interleaved nibble order: byte j holds k=off+j (low) and k=off+16+j (high) */
        __m256i qw = nibbles32(wr + off / 2);
        __m256i qx = _mm256_loadu_si256((const __m256i *)(xq + off));
        __m256i aw = _mm256_sign_epi8(qw, qw);
        __m256i sx = _mm256_sign_epi8(qx, qw);
        __m256i d16 = _mm256_maddubs_epi16(aw, sx);
        iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(d16, ones));
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(sr[b] * xs[b]), _mm256_cvtepi32_ps(iacc), acc);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    y[r] = _mm_cvtss_f32(h);
  }
}

/* Variant "u4x4": unsigned nibbles (0..15) x int8 activations with maddubs directly, the -8 offset
 * removed afterwards with a per-block activation sum (shared by all rows), 4 rows per pass. */
static inline __m256i unibbles32(const uint8_t *p) {
  __m128i b = _mm_loadu_si128((const __m128i *)p);
  __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

static void gemv_u4x4(const uint8_t *w, const float *ws, const int8_t *xq, const float *xs, const int *xsum,
                      float *y, int n, int k, int blk) {
  const int nb = k / blk, sub = blk / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < n; r += 4) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float corr[4] = {0, 0, 0, 0};
    for (int b = 0; b < nb; ++b) {
      __m256i ia[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int s = 0; s < sub; ++s) {
        const int off = b * blk + s * 32;
        __m256i qx = _mm256_loadu_si256((const __m256i *)(xq + off));
        for (int j = 0; j < 4; ++j) {
          __m256i qw = unibbles32(w + (size_t)(r + j) * k / 2 + off / 2);
          ia[j] = _mm256_add_epi32(ia[j], _mm256_madd_epi16(_mm256_maddubs_epi16(qw, qx), ones));
        }
      }
      for (int j = 0; j < 4; ++j) {
        float sc = ws[(size_t)(r + j) * nb + b] * xs[b];
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(sc), _mm256_cvtepi32_ps(ia[j]), acc[j]);
        corr[j] += sc * 8.0f * (float)xsum[b];
      }
    }
    for (int j = 0; j < 4; ++j) {
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
      h = _mm_hadd_ps(h, h);
      h = _mm_hadd_ps(h, h);
      y[r + j] = _mm_cvtss_f32(h) - corr[j];
    }
  }
}

int main(int argc, char **argv) {
  int blk = argc > 1 ? atoi(argv[1]) : 128;
  /* the predictor step: 5 x (1024x4096, 2048x1024, 1024x6144, 3072x1024) (N x K shown as K->N) */
  int shapes[4][2] = {{1024, 4096}, {2048, 1024}, {1024, 6144}, {3072, 1024}};
  size_t params = 0;
  uint8_t *w[20]; float *ws[20]; int8_t *xq; float *xs, *y;
  xq = aligned_alloc(64, 8192); xs = malloc(8192 / 32 * 4); y = malloc(8192 * 4);
  for (int i = 0; i < 8192; ++i) xq[i] = (int8_t)(rand() % 255 - 127);
  for (int i = 0; i < 8192 / 32; ++i) xs[i] = 0.01f;
  for (int l = 0; l < 20; ++l) {
    int k = shapes[l % 4][0], n = shapes[l % 4][1];
    w[l] = aligned_alloc(64, (size_t)n * k / 2);
    ws[l] = malloc((size_t)n * (k / blk) * 4);
    for (size_t i = 0; i < (size_t)n * k / 2; ++i) w[l][i] = rand();
    for (size_t i = 0; i < (size_t)n * (k / blk); ++i) ws[l][i] = 0.01f;
    params += (size_t)n * k;
  }
  double best = 1e9;
  for (int rep = 0; rep < 30; ++rep) {
    double t0 = now();
    for (int l = 0; l < 20; ++l) gemv_q4(w[l], ws[l], xq, xs, y, shapes[l % 4][1], shapes[l % 4][0], blk);
    double t = now() - t0;
    if (t < best) best = t;
  }
  int xsum[8192 / 32];
  for (int b = 0; b < 8192 / blk; ++b) { xsum[b] = 0; for (int i = 0; i < blk; ++i) xsum[b] += xq[b * blk + i]; }
  double best2 = 1e9;
  for (int rep = 0; rep < 30; ++rep) {
    double t0 = now();
    for (int l = 0; l < 20; ++l) gemv_u4x4(w[l], ws[l], xq, xs, xsum, y, shapes[l % 4][1], shapes[l % 4][0], blk);
    double t = now() - t0;
    if (t < best2) best2 = t;
  }
  printf("u4x4  block %d: %.2f ms -> %.1f Gparam/s\n", blk, best2 * 1e3, params / best2 / 1e9);
  printf("block %d: %.1f M params in %.2f ms (thread CPU time, best of 30) -> %.1f Gparam/s, %.1f GB/s of int4\n",
         blk, params / 1e6, best * 1e3, params / best / 1e9, params / 2.0 / best / 1e9);
  return 0;
}
