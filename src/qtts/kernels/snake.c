/* qtts kernels: a fused SnakeBeta operator for onnxruntime (domain "qtts.kernels", op "SnakeBeta";
 * the domain's second op, DecoderLayer, is layer*.c: RegisterCustomOps below adds both).
 *
 *   y = x + inv_b * sin(a * x)^2        x [..., C, T] float32; a, inv_b: C values ([1, C, 1])
 *
 * The exported vocoder computes this as Mul -> Sin -> Mul -> Mul -> Add, five passes over the
 * activation, and onnxruntime's Sin is scalar and single-threaded. Here it is one pass:
 *
 * - sin^2 has period pi, so v = a * x is reduced to r = v - n * pi in [-pi/2, pi/2] (n = nearest
 *   integer of v / pi; pi in three parts, Cody-Waite, exact products for |n| < 2^13) and
 *   sin(r) is an odd degree-13 Taylor polynomial (truncation error < 7e-10 on that interval);
 *   lanes with |v| >= REDUCE_LIMIT (rare) take libm's sinf instead, so large inputs stay exact;
 * - code paths picked once at load time: on x86-64 AVX-512F (16 lanes) and AVX2 + FMA (8 lanes),
 *   on arm64 NEON (AdvSIMD, part of every AArch64 CPU: 2 x 4 lanes with FMA), and everywhere
 *   plain C that the compiler vectorises for the baseline ISA (SSE2 on x86-64, NEON on arm64);
 *   QTTS_KERNELS_ISA=avx512|avx2|neon|generic forces one (tests run every path);
 * - the tensor is cut into blocks of BLOCK values spread over the session's intra-op threads.
 *
 * The library also exports qtts_snake_beta() (the same kernel on plain arrays, for tests
 * through ctypes) and qtts_kernels_isa() (the path in use). Built by qtts/kernels/__init__.py.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ort_abi.h"
#include "sin2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QTTS_X86 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define QTTS_NEON 1
#endif

#define BLOCK 16384

typedef void (*RunFn)(const float *x, float *y, size_t n, float a, float inv_b);

/* ----------------------------------------------------------------------------- plain C */
static inline float sin2_poly(float v) {
  float n = (v * INV_PI + ROUND_MAGIC) - ROUND_MAGIC;
  float r = v - n * PI_A;
  r = r - n * PI_B;
  r = r - n * PI_C;
  float r2 = r * r;
  float p = S13;
  p = p * r2 + S11;
  p = p * r2 + S9;
  p = p * r2 + S7;
  p = p * r2 + S5;
  p = p * r2 + S3;
  float s = r + r * r2 * p;
  return s * s;
}

static inline float snake_exact(float x, float a, float inv_b) {
  float s = sinf(a * x);
  return x + inv_b * (s * s);
}

static void run_generic(const float *x, float *y, size_t n, float a, float inv_b) {
  for (size_t t = 0; t < n; ++t) y[t] = x[t] + inv_b * sin2_poly(a * x[t]); /* vectorised */
  for (size_t t = 0; t < n; ++t)
    if (!(fabsf(a * x[t]) < REDUCE_LIMIT) && !isnan(x[t])) y[t] = snake_exact(x[t], a, inv_b);
}

/* ----------------------------------------------------------------------------- x86 */
#ifdef QTTS_X86
__attribute__((target("avx2,fma"))) static inline __m256 sin2_avx2(__m256 v) {
  __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(INV_PI)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PI_A), v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PI_B), r);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PI_C), r);
  __m256 r2 = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(S13);
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(S11));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(S9));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(S7));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(S5));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(S3));
  __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(r, r2), p, r);
  return _mm256_mul_ps(s, s);
}

__attribute__((target("avx2,fma"))) static void run_avx2(const float *x, float *y, size_t n, float a, float inv_b) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(inv_b);
  const __m256 lim = _mm256_set1_ps(REDUCE_LIMIT), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256 xv = _mm256_loadu_ps(x + t);
    __m256 v = _mm256_mul_ps(xv, va);
    _mm256_storeu_ps(y + t, _mm256_fmadd_ps(vb, sin2_avx2(v), xv));
    if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), lim, _CMP_GE_OQ)))
      for (size_t k = t; k < t + 8; ++k)
        if (fabsf(a * x[k]) >= REDUCE_LIMIT) y[k] = snake_exact(x[k], a, inv_b);
  }
  if (t < n) run_generic(x + t, y + t, n - t, a, inv_b);
}

__attribute__((target("avx512f"))) static inline __m512 sin2_avx512(__m512 v) {
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(INV_PI)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PI_A), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PI_B), r);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PI_C), r);
  __m512 r2 = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(S13);
  p = _mm512_fmadd_ps(p, r2, _mm512_set1_ps(S11));
  p = _mm512_fmadd_ps(p, r2, _mm512_set1_ps(S9));
  p = _mm512_fmadd_ps(p, r2, _mm512_set1_ps(S7));
  p = _mm512_fmadd_ps(p, r2, _mm512_set1_ps(S5));
  p = _mm512_fmadd_ps(p, r2, _mm512_set1_ps(S3));
  __m512 s = _mm512_fmadd_ps(_mm512_mul_ps(r, r2), p, r);
  return _mm512_mul_ps(s, s);
}

__attribute__((target("avx512f"))) static void run_avx512(const float *x, float *y, size_t n, float a, float inv_b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(inv_b), lim = _mm512_set1_ps(REDUCE_LIMIT);
  size_t t = 0;
  for (; t + 16 <= n; t += 16) {
    __m512 xv = _mm512_loadu_ps(x + t);
    __m512 v = _mm512_mul_ps(xv, va);
    _mm512_storeu_ps(y + t, _mm512_fmadd_ps(vb, sin2_avx512(v), xv));
    if (_mm512_cmp_ps_mask(_mm512_abs_ps(v), lim, _CMP_GE_OQ))
      for (size_t k = t; k < t + 16; ++k)
        if (fabsf(a * x[k]) >= REDUCE_LIMIT) y[k] = snake_exact(x[k], a, inv_b);
  }
  if (t < n) run_generic(x + t, y + t, n - t, a, inv_b);
}
#endif

/* ----------------------------------------------------------------------------- arm64 */
#ifdef QTTS_NEON
static inline float32x4_t sin2_neon(float32x4_t v) {
  float32x4_t n = vrndnq_f32(vmulq_n_f32(v, INV_PI)); /* round to nearest, ties to even */
  float32x4_t r = vfmsq_f32(v, n, vdupq_n_f32(PI_A)); /* r = v - n * PI_A, fused */
  r = vfmsq_f32(r, n, vdupq_n_f32(PI_B));
  r = vfmsq_f32(r, n, vdupq_n_f32(PI_C));
  float32x4_t r2 = vmulq_f32(r, r);
  float32x4_t p = vfmaq_f32(vdupq_n_f32(S11), r2, vdupq_n_f32(S13)); /* S11 + r2 * S13 */
  p = vfmaq_f32(vdupq_n_f32(S9), r2, p);
  p = vfmaq_f32(vdupq_n_f32(S7), r2, p);
  p = vfmaq_f32(vdupq_n_f32(S5), r2, p);
  p = vfmaq_f32(vdupq_n_f32(S3), r2, p);
  float32x4_t s = vfmaq_f32(r, vmulq_f32(r, r2), p);
  return vmulq_f32(s, s);
}

/* Two vectors per iteration: the polynomial is a serial chain, two chains keep the FMA pipes busy. */
static void run_neon(const float *x, float *y, size_t n, float a, float inv_b) {
  const float32x4_t va = vdupq_n_f32(a), vb = vdupq_n_f32(inv_b), lim = vdupq_n_f32(REDUCE_LIMIT);
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    float32x4_t x0 = vld1q_f32(x + t), x1 = vld1q_f32(x + t + 4);
    float32x4_t v0 = vmulq_f32(x0, va), v1 = vmulq_f32(x1, va);
    vst1q_f32(y + t, vfmaq_f32(x0, vb, sin2_neon(v0)));
    vst1q_f32(y + t + 4, vfmaq_f32(x1, vb, sin2_neon(v1)));
    uint32x4_t big = vorrq_u32(vcageq_f32(v0, lim), vcageq_f32(v1, lim)); /* |v| >= limit */
    if (vmaxvq_u32(big))
      for (size_t k = t; k < t + 8; ++k)
        if (fabsf(a * x[k]) >= REDUCE_LIMIT) y[k] = snake_exact(x[k], a, inv_b);
  }
  if (t < n) run_generic(x + t, y + t, n - t, a, inv_b);
}
#endif

/* ----------------------------------------------------------------------------- dispatch */
static RunFn pick(const char *isa, const char **name) {
  int any = isa == NULL || *isa == '\0';
#ifdef QTTS_X86
  __builtin_cpu_init();
  if ((any || !strcmp(isa, "avx512")) && __builtin_cpu_supports("avx512f")) return *name = "avx512", run_avx512;
  if ((any || !strcmp(isa, "avx2")) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return *name = "avx2", run_avx2;
#endif
#ifdef QTTS_NEON
  if (any || !strcmp(isa, "neon")) return *name = "neon", run_neon; /* AdvSIMD: every AArch64 CPU */
#endif
  if (any || !strcmp(isa, "generic")) return *name = "generic", run_generic;
  return *name = NULL, NULL;
}

static RunFn g_run;
static const char *g_isa;

static void ensure_picked(void) {
  if (!g_run) g_run = pick(getenv("QTTS_KERNELS_ISA"), &g_isa);
  if (!g_run) g_run = pick(NULL, &g_isa); /* an unknown or unavailable name: the best path */
}

const char *qtts_kernels_isa(void) {
  ensure_picked();
  return g_isa;
}

typedef struct {
  const float *x, *a, *inv_b;
  float *y;
  size_t channels, inner, total;
  RunFn run;
} Job;

/* Block i: values [i * BLOCK, (i + 1) * BLOCK) of the flat tensor, row by row (a row: one (n, c)). */
static void run_block(void *data, size_t i) {
  const Job *j = (const Job *)data;
  size_t start = i * BLOCK, end = start + BLOCK < j->total ? start + BLOCK : j->total;
  while (start < end) {
    size_t row = start / j->inner, stop = (row + 1) * j->inner;
    if (stop > end) stop = end;
    size_t c = row % j->channels;
    j->run(j->x + start, j->y + start, stop - start, j->a[c], j->inv_b[c]);
    start = stop;
  }
}

/* The kernel on plain arrays: x, y [rows * inner], row r uses a[r % channels], inv_b[r % channels].
 * isa: NULL for the best path, else "avx512" | "avx2" | "neon" | "generic"; returns -1 if that is unavailable. */
int qtts_snake_beta(const float *x, const float *a, const float *inv_b, float *y, size_t rows, size_t channels,
                    size_t inner, const char *isa) {
  const char *name;
  RunFn run = pick(isa, &name);
  if (!run || channels == 0) return -1;
  if (inner == 0) return 0;
  Job j = {x, a, inv_b, y, channels, inner, rows * inner, run};
  for (size_t i = 0; i * BLOCK < j.total; ++i) run_block(&j, i);
  return 0;
}

/* ----------------------------------------------------------------------------- the ORT op */
static const QttsOrtApi *g_api;

static Status fail(const char *msg) { return g_api->CreateStatus(QTTS_ORT_INVALID_ARGUMENT, msg); }

static Status input(OrtKernelContext *ctx, size_t i, const OrtValue **v, int64_t *dims, size_t *rank, size_t *count) {
  OrtTensorTypeAndShapeInfo *info;
  int type = 0;
  QTTS_TRY(g_api->KernelContext_GetInput(ctx, i, v));
  QTTS_TRY(g_api->GetTensorTypeAndShape(*v, &info));
  Status st = g_api->GetDimensionsCount(info, rank);
  if (!st && *rank > 8) st = fail("qtts.kernels SnakeBeta: rank > 8");
  if (!st) st = g_api->GetDimensions(info, dims, *rank);
  if (!st) st = g_api->GetTensorShapeElementCount(info, count);
  if (!st) st = g_api->GetTensorElementType(info, &type);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (!st && type != QTTS_ORT_FLOAT) st = fail("qtts.kernels SnakeBeta: float32 tensors only");
  return st;
}

static Status compute(void *kernel, OrtKernelContext *ctx) {
  (void)kernel;
  const OrtValue *xv, *av, *bv;
  int64_t dims[8], unused[8];
  size_t rank, r2, count, na, nb;
  void *p;
  QTTS_TRY(input(ctx, 0, &xv, dims, &rank, &count));
  QTTS_TRY(input(ctx, 1, &av, unused, &r2, &na));
  QTTS_TRY(input(ctx, 2, &bv, unused, &r2, &nb));
  if (rank < 3 || dims[rank - 2] < 1 || na != (size_t)dims[rank - 2] || nb != (size_t)dims[rank - 2])
    return fail("qtts.kernels SnakeBeta: x must be [..., C, T] with a and inv_b holding C values");
  OrtValue *out;
  QTTS_TRY(g_api->KernelContext_GetOutput(ctx, 0, dims, rank, &out));
  Job j = {0};
  QTTS_TRY(g_api->GetTensorMutableData((OrtValue *)xv, &p)); j.x = p;
  QTTS_TRY(g_api->GetTensorMutableData((OrtValue *)av, &p)); j.a = p;
  QTTS_TRY(g_api->GetTensorMutableData((OrtValue *)bv, &p)); j.inv_b = p;
  QTTS_TRY(g_api->GetTensorMutableData(out, &p)); j.y = p;
  j.channels = (size_t)dims[rank - 2];
  j.inner = (size_t)dims[rank - 1];
  j.total = count;
  j.run = g_run;
  if (count == 0 || j.inner == 0) return NULL;
  size_t blocks = (count + BLOCK - 1) / BLOCK;
  if (blocks == 1) {
    run_block(&j, 0);
    return NULL;
  }
  return g_api->KernelContext_ParallelFor(ctx, run_block, blocks, 0, &j);
}

static Status create_kernel(const OrtCustomOp *op, const QttsOrtApi *api, const OrtKernelInfo *info, void **k) {
  (void)op; (void)api; (void)info;
  *k = (void *)1;
  return NULL;
}
static const char *op_name(const OrtCustomOp *op) { (void)op; return "SnakeBeta"; }
static const char *op_ep(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int op_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return QTTS_ORT_FLOAT; }
static size_t op_inputs(const OrtCustomOp *op) { (void)op; return 3; }
static size_t op_outputs(const OrtCustomOp *op) { (void)op; return 1; }
static int op_zero(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int op_start(const OrtCustomOp *op) { (void)op; return 1; }
static int op_end(const OrtCustomOp *op) { (void)op; return 2147483647; }
static void op_destroy(void *k) { (void)k; }

static OrtCustomOp g_op;
static OrtCustomOpDomain *g_domain;

/* onnxruntime's entry point for SessionOptions.register_custom_ops_library(path). */
Status RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  if (!g_api) g_api = base->GetApi(QTTS_ORT_API);
  if (!g_api) return NULL; /* an onnxruntime older than 1.17: nothing registered, graphs fall back */
  ensure_picked();
  if (!g_domain) {
    memset(&g_op, 0, sizeof g_op);
    g_op.version = QTTS_ORT_API;
    g_op.GetName = op_name;
    g_op.GetExecutionProviderType = op_ep;
    g_op.GetInputType = op_type;
    g_op.GetInputTypeCount = op_inputs;
    g_op.GetOutputType = op_type;
    g_op.GetOutputTypeCount = op_outputs;
    g_op.KernelDestroy = op_destroy;
    g_op.GetInputCharacteristic = op_zero;
    g_op.GetOutputCharacteristic = op_zero;
    g_op.GetInputMemoryType = op_zero;
    g_op.CreateKernelV2 = create_kernel;
    g_op.KernelComputeV2 = compute;
    g_op.GetStartVersion = op_start;
    g_op.GetEndVersion = op_end;
    QTTS_TRY(g_api->CreateCustomOpDomain("qtts.kernels", &g_domain));
    QTTS_TRY(g_api->CustomOpDomain_Add(g_domain, &g_op));
    QTTS_TRY(g_api->CustomOpDomain_Add(g_domain, qtts_layer_custom_op(g_api)));
  }
  return g_api->AddCustomOpDomain(options, g_domain);
}
