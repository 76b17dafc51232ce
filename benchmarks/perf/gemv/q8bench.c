/* One matrix, many calls: q8vnni.c's qgemv (8-bit, block 128, 1 thread) on K x N against a plain
 * streaming read of the same bytes, over 8 copies of the weights (so that they do not sit in the
 * L3 cache), GB/s per CPU-second. HUGE=1 in the environment puts the weights on 2 MB transparent
 * huge pages (madvise); compare a run with and without it.
 *     gcc -O3 -march=native -fopenmp q8bench.c q8vnni.c -o q8bench -lm
 *     ./q8bench 1024 6144 300; HUGE=1 ./q8bench 1024 6144 300      (also 3072 1024)
 * Build q8vnni.c with -DROWS=4 and run with Q8VNNI_GENERIC=1 to see interleaved rows.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int qgemv(const float *x, int k, int n, const uint8_t *B, const float *S, float *y, int bits, int blk, int threads);

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: q8bench K N CALLS\n"); return 2; }
  const int k = atoi(argv[1]), n = atoi(argv[2]), reps = atoi(argv[3]), copies = 8, kb = k / 128;
  const size_t nb = (size_t)k * n, huge = 2u << 20, tot = (nb * copies + huge - 1) / huge * huge;
  uint8_t *B = aligned_alloc(huge, tot);
  if (getenv("HUGE")) madvise(B, tot, MADV_HUGEPAGE);
  for (size_t i = 0; i < nb * copies; i++) B[i] = (uint8_t)rand();
  float *S = malloc(sizeof(float) * n * kb * copies), *x = malloc(4 * k), *y = malloc(4 * n);
  for (int i = 0; i < n * kb * copies; i++) S[i] = 0.01f;
  for (int i = 0; i < k; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
  double t0 = cpu_now();
  for (int r = 0; r < reps; r++) qgemv(x, k, n, B + nb * (r % copies), S + (size_t)n * kb * (r % copies), y, 8, 128, 1);
  double dt = cpu_now() - t0;
  printf("K %d N %d: qgemv %.3f ms per call, %.1f GB/s\n", k, n, 1e3 * dt / reps, nb * reps / dt / 1e9);
  __m512i acc = _mm512_setzero_si512();
  t0 = cpu_now();
  for (int r = 0; r < reps; r++) {
    const uint8_t *p = B + nb * (r % copies);
    for (size_t i = 0; i < nb; i += 64) acc = _mm512_add_epi8(acc, _mm512_load_si512(p + i));
  }
  dt = cpu_now() - t0;
  printf("streaming read: %.1f GB/s (%d)\n", nb * reps / dt / 1e9, _mm512_reduce_add_epi32(acc));
  return 0;
}
