/* qtts kernels: the int8 GEMV of the DecoderLayer op, onnxruntime's MatMulNBits (bits 8, block
 * 128, no zero points: 128; accuracy_level 4) on one or two activation rows:
 *
 *   out[t][n] = sum_b (s[n][b] * sa[t][b]) * (float)(sum_k (q[n][b][k] - 128) * qa[t][b][k])
 *
 * summed over b = 0, 1, ... in that order. A path computes the exact integer dot any way it likes
 * (sum_k q * qa with q unsigned, as vpdpbusd takes it, minus 128 * sum_k qa: the same integer),
 * then the block's product with its two scales: two IEEE multiplies of exact operands, the same
 * bits in a vector lane as in plain C. The sums over b are one shared piece of C (gemv_rows), so
 * every path gives the same bits.
 *
 * The weights are read as one flat stream of 128-byte chunks (row after row, block after block):
 * 16 chunks per step on AVX-512 (one zmm accumulator each, two vpdpbusd per chunk, then one
 * transposing reduction gives the 16 dots in one vector), so the memory access is sequential and
 * each weight byte is loaded once for both activation rows of T = 2.
 * Paths: AVX-512 VNNI, AVX2 (zero-extend to int16 and vpmaddwd: exact, unlike vpmaddubsw which
 * saturates), plain C. QTTS_KERNELS_ISA=avx512|avx2|generic forces one (at first use).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LAYER_X86 1
#endif

/* ----------------------------------------------------------------------------- plain C */
/* Chunks c0 .. n-1 of the n (the whole of the plain path, the tail of the vector paths). */
static void dot_tail(const uint8_t *w, const float *s, size_t c0, size_t n, const QAct *a, float *out) {
  const size_t nb = a->nb, K = nb * QBLOCK;
  for (size_t c = c0; c < n; ++c) {
    const uint8_t *wc = w + c * QBLOCK;
    const size_t b = c % nb;
    for (int t = 0; t < a->T; ++t) {
      const int8_t *qa = a->q + t * K + b * QBLOCK;
      int32_t dot = 0;
      for (int k = 0; k < QBLOCK; ++k) dot += (int32_t)wc[k] * qa[k];
      out[t * n + c] = (s[c] * a->scale[t * QSTRIDE(nb) + b]) * (float)(dot - a->corr[t * QSTRIDE(nb) + b]);
    }
  }
}

static void dot_generic(const uint8_t *w, const float *s, size_t n, const QAct *a, float *out) {
  dot_tail(w, s, 0, n, a, out);
}

/* ----------------------------------------------------------------------------- x86 */
#ifdef LAYER_X86
#define T512 __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define T256 __attribute__((target("avx2")))

/* v[i] -> lane i of the result holds the sum of v[i]'s 16 lanes. Four halving steps: pairs of
 * vectors fold into one (half of each one's lanes summed), so 16 sums cost 15 folds. */
T512 static inline __m512i reduce16(const __m512i v[16]) {
  __m512i s[8], u[4], x0, x1;
  for (int i = 0; i < 8; ++i) /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
    s[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                            _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) /* per 128-bit lane: that lane's sums of 4 vectors */
    u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[2 * i], s[2 * i + 1]),
                            _mm512_unpackhi_epi64(s[2 * i], s[2 * i + 1]));
  x0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
  x1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(x0, x1, 0x88), _mm512_shuffle_i32x4(x0, x1, 0xDD));
}

T512 static inline __m512i dp128(const uint8_t *w, const int8_t *qa) {
  __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(w), _mm512_loadu_si512(qa));
  return _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(w + 64), _mm512_loadu_si512(qa + 64));
}

/* Two 8-lane halves (lo: row 0's chunks, hi: row 1's) as one vector. */
T512 static inline __m512 join_ps(const float *lo, const float *hi) {
  __m256d l = _mm256_castps_pd(_mm256_loadu_ps(lo)), h = _mm256_castps_pd(_mm256_loadu_ps(hi));
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(l), h, 1));
}
T512 static inline __m512i join_epi32(const int32_t *lo, const int32_t *hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                            _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* T = 1: 16 chunks a step, one accumulator each; the 16 products in one vector. */
T512 static size_t dot512_t1(const uint8_t *w, const float *s, size_t n, const QAct *a, float *out) {
  const size_t nb = a->nb;
  size_t c = 0, b = 0;
  for (; c + 16 <= n; c += 16) {
    const size_t b0 = b;
    __m512i acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      acc[i] = dp128(w + (c + i) * QBLOCK, a->q + b * QBLOCK);
      b = b + 1 == nb ? 0 : b + 1;
    }
    __m512i dots = _mm512_sub_epi32(reduce16(acc), _mm512_loadu_si512(a->corr + b0));
    __m512 scale = _mm512_mul_ps(_mm512_loadu_ps(s + c), _mm512_loadu_ps(a->scale + b0));
    _mm512_storeu_ps(out + c, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(dots)));
  }
  return c;
}

/* T = 2: 8 chunks a step, each against both rows (acc[t * 8 + i]): one weight load, two uses. */
T512 static size_t dot512_t2(const uint8_t *w, const float *s, size_t n, const QAct *a, float *out) {
  const size_t nb = a->nb, K = nb * QBLOCK, st = QSTRIDE(nb);
  size_t c = 0, b = 0;
  for (; c + 8 <= n; c += 8) {
    const size_t b0 = b;
    __m512i acc[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const uint8_t *wc = w + (c + i) * QBLOCK;
      __m512i w0 = _mm512_loadu_si512(wc), w1 = _mm512_loadu_si512(wc + 64);
      const int8_t *q0 = a->q + b * QBLOCK, *q1 = q0 + K;
      acc[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_loadu_si512(q0)), w1,
                                   _mm512_loadu_si512(q0 + 64));
      acc[8 + i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_loadu_si512(q1)),
                                       w1, _mm512_loadu_si512(q1 + 64));
      b = b + 1 == nb ? 0 : b + 1;
    }
    __m512i dots = _mm512_sub_epi32(reduce16(acc), join_epi32(a->corr + b0, a->corr + st + b0));
    __m512 scale = _mm512_mul_ps(join_ps(s + c, s + c), join_ps(a->scale + b0, a->scale + st + b0));
    __m512 p = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(dots));
    _mm256_storeu_ps(out + c, _mm512_castps512_ps256(p));
    _mm256_storeu_pd((double *)(out + n + c), _mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
  }
  return c;
}

T512 static void dot_avx512(const uint8_t *w, const float *s, size_t n, const QAct *a, float *out) {
  size_t c = a->T == 1 ? dot512_t1(w, s, n, a, out) : dot512_t2(w, s, n, a, out);
  dot_tail(w, s, c, n, a, out); /* the last chunks: the plain code (the same bits) */
}

/* v[i] -> lane i holds the sum of v[i]'s 8 lanes (hadd twice, then the two 128-bit halves). */
T256 static inline __m256i reduce8(const __m256i v[8]) {
  __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* 8 lanes from g-lane pieces of rows 0 and 1 (g = 8: row 0 only). */
T256 static inline __m256 lanes_ps(const float *r0, const float *r1, const int g) {
  if (g == 8) return _mm256_loadu_ps(r0);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r0)), _mm_loadu_ps(r1), 1);
}
T256 static inline __m256i lanes_epi32(const int32_t *r0, const int32_t *r1, const int g) {
  if (g == 8) return _mm256_loadu_si256((const __m256i *)r0);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)r0)),
                                 _mm_loadu_si128((const __m128i *)r1), 1);
}

/* 8 accumulators over g chunks x T rows (g = 8 / T), 16 values of each chunk at a time; inlined
 * with constant g and T below, so the loops unroll and the accumulators stay in registers. */
T256 static inline __attribute__((always_inline)) size_t dot256(const uint8_t *w, const float *s, size_t n,
                                                                 const QAct *a, float *out, const int g, const int T) {
  const size_t nb = a->nb, K = nb * QBLOCK, st = QSTRIDE(nb);
  size_t c = 0, b = 0;
  for (; c + g <= n; c += g) {
    const size_t b0 = b;
    __m256i acc[8];
    const int16_t *qa[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_si256();
    for (int i = 0; i < g; ++i) qa[i] = a->q16 + b * QBLOCK, b = b + 1 == nb ? 0 : b + 1;
    for (int k = 0; k < QBLOCK; k += 16)
      for (int i = 0; i < g; ++i) {
        __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + (c + i) * QBLOCK + k)));
        for (int t = 0; t < T; ++t) {
          __m256i x = _mm256_loadu_si256((const __m256i *)(qa[i] + t * K + k));
          acc[t * g + i] = _mm256_add_epi32(acc[t * g + i], _mm256_madd_epi16(wv, x));
        }
      }
    __m256i dots = _mm256_sub_epi32(reduce8(acc), lanes_epi32(a->corr + b0, a->corr + st + b0, g));
    __m256 scale = _mm256_mul_ps(lanes_ps(s + c, s + c, g), lanes_ps(a->scale + b0, a->scale + st + b0, g));
    __m256 p = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(dots));
    if (T == 1) {
      _mm256_storeu_ps(out + c, p);
    } else {
      _mm_storeu_ps(out + c, _mm256_castps256_ps128(p));
      _mm_storeu_ps(out + n + c, _mm256_extractf128_ps(p, 1));
    }
  }
  return c;
}

T256 static void dot_avx2(const uint8_t *w, const float *s, size_t n, const QAct *a, float *out) {
  size_t c = a->T == 1 ? dot256(w, s, n, a, out, 8, 1) : dot256(w, s, n, a, out, 4, 2);
  dot_tail(w, s, c, n, a, out);
}
#endif

/* ----------------------------------------------------------------------------- dispatch */
static DotFn pick_named(const char *isa, const char **name) {
  int any = isa == NULL || *isa == '\0';
#ifdef LAYER_X86
  __builtin_cpu_init();
  if ((any || !strcmp(isa, "avx512")) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    return *name = "avx512", dot_avx512;
  if ((any || !strcmp(isa, "avx2")) && __builtin_cpu_supports("avx2")) return *name = "avx2", dot_avx2;
#endif
  if (any || !strcmp(isa, "generic")) return *name = "generic", dot_generic;
  return *name = NULL, NULL;
}

static DotFn g_dot;
static const char *g_dot_name;

static void pick_default(void) {
  g_dot = pick_named(getenv("QTTS_KERNELS_ISA"), &g_dot_name);
  if (!g_dot) g_dot = pick_named(NULL, &g_dot_name); /* unknown or unavailable here: the best */
}

DotFn qtts_dot_pick(const char *isa, const char **name) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (isa && *isa) return pick_named(isa, name);
  pthread_once(&once, pick_default);
  *name = g_dot_name;
  return g_dot;
}

int qtts_dot_wants16(DotFn dot) {
#ifdef LAYER_X86
  return dot == dot_avx2;
#else
  (void)dot;
  return 0;
#endif
}

/* The DecoderLayer's int8 path on this CPU (QTTS_KERNELS_ISA or the best): avx512 (VNNI), avx2, generic. */
const char *qtts_layer_isa(void) {
  const char *name;
  qtts_dot_pick(NULL, &name);
  return name;
}

/* ----------------------------------------------------------------------------- the GEMV */
typedef struct {
  const uint8_t *q;
  const float *s;
  size_t rows, span, unit_rows; /* span: the rows the units cover (rows, or rows / 2 for a GLU) */
  const QAct *a;
  float *out, *glu; /* glu: NULL, or [T][rows / 2] silu(gate) * up (gate: the first half of the rows) */
  DotFn dot;
} Gemv;

/* Rows [r, end): each path's block products for a piece of rows (small enough for L1), then the
 * rows' sums over b = 0, 1, ... in order: one piece of C for every path. */
static void gemv_rows(const Gemv *g, size_t r, size_t end) {
  const size_t nb = g->a->nb, piece = LAYER_MAX_BLOCKS / nb;
  float p[LAYER_MAX_T * LAYER_MAX_BLOCKS];
  for (; r < end; r += piece) {
    const size_t n = end - r < piece ? end - r : piece;
    g->dot(g->q + r * nb * QBLOCK, g->s + r * nb, n * nb, g->a, p);
    for (int t = 0; t < g->a->T; ++t)
      for (size_t i = 0; i < n; ++i) {
        const float *pi = p + (t * n + i) * nb;
        float acc = 0.0f;
        for (size_t b = 0; b < nb; ++b) acc += pi[b];
        g->out[t * g->rows + r + i] = acc;
      }
  }
}

/* Unit u: rows [u * unit_rows, ...) of the span; for a GLU also the same rows of the second half,
 * then silu(gate) * up of those rows (so the activation is spread over the threads too). */
static void gemv_unit(void *ctx, size_t u) {
  const Gemv *g = ctx;
  size_t r = u * g->unit_rows, end = r + g->unit_rows < g->span ? r + g->unit_rows : g->span;
  gemv_rows(g, r, end);
  if (!g->glu) return;
  gemv_rows(g, g->span + r, g->span + end);
  for (int t = 0; t < g->a->T; ++t) {
    const float *gate = g->out + t * g->rows, *up = gate + g->span;
    for (size_t i = r; i < end; ++i) g->glu[t * g->span + i] = (gate[i] / (1.0f + expf(-gate[i]))) * up[i];
  }
}

static void run(Gemv *g) {
  /* ~8 units per thread: taken first come first served, so a thread the VM stalls costs one unit */
  size_t threads = (size_t)qtts_pool_size(), target = threads > 1 ? threads * 8 : 1;
  size_t unit = (g->span + target - 1) / target;
  g->unit_rows = (unit + 15) / 16 * 16;
  qtts_pool_run(gemv_unit, g, (g->span + g->unit_rows - 1) / g->unit_rows);
}

void qtts_gemv(const uint8_t *q, const float *s, size_t rows, const QAct *a, float *out, DotFn dot) {
  Gemv g = {q, s, rows, rows, 0, a, out, NULL, dot};
  run(&g);
}

void qtts_gemv_glu(const uint8_t *q, const float *s, size_t rows, const QAct *a, float *out, float *glu, DotFn dot) {
  Gemv g = {q, s, rows, rows / 2, 0, a, out, glu, dot};
  run(&g);
}
