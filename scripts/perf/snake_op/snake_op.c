/* Prototype onnxruntime custom-op library: fused SnakeBeta y = x + inv_b * sin(a * x)^2.
 *
 * Domain "qtts.perf", op "SnakeBeta", inputs x [N, C, ...] fp32, a [C]-broadcastable ([1, C, 1]),
 * inv_b (same), output y like x. AVX2 + FMA, 8 lanes; sin by Cody-Waite reduction modulo pi
 * (sin^2 has period pi) and a degree-13 odd Taylor polynomial on [-pi/2, pi/2] (truncation
 * error < 1e-9). Rows (n, c) are spread over the session's intra-op pool with
 * KernelContext_ParallelFor. Build: see build.sh (needs onnxruntime_c_api.h, API >= 17).
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "onnxruntime_c_api.h"

static const OrtApi *g_api;

typedef struct {
  const float *x, *a, *inv_b;
  float *y;
  size_t channels, inner;
} Job;

static inline float sin2_scalar(float v) {
  float n = nearbyintf(v * 0.318309886183790671538f);
  float r = fmaf(-n, 3.140625f, v);
  r = fmaf(-n, 9.67502593994140625e-4f, r);
  r = fmaf(-n, 1.509957990978376432e-7f, r);
  float r2 = r * r;
  float p = 1.6059043836821615e-10f;
  p = fmaf(p, r2, -2.5052108385441720e-8f);
  p = fmaf(p, r2, 2.7557319223985893e-6f);
  p = fmaf(p, r2, -1.9841269841269841e-4f);
  p = fmaf(p, r2, 8.3333333333333333e-3f);
  p = fmaf(p, r2, -1.6666666666666667e-1f);
  float s = fmaf(r * r2, p, r);
  return s * s;
}

static inline __m256 sin2_avx(__m256 v) {
  const __m256 inv_pi = _mm256_set1_ps(0.318309886183790671538f);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(v, inv_pi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(3.140625f), v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(9.67502593994140625e-4f), r);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.509957990978376432e-7f), r);
  __m256 r2 = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(1.6059043836821615e-10f);
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(-2.5052108385441720e-8f));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(2.7557319223985893e-6f));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(-1.9841269841269841e-4f));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(8.3333333333333333e-3f));
  p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(-1.6666666666666667e-1f));
  __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(r, r2), p, r);
  return _mm256_mul_ps(s, s);
}

static void row(void *data, size_t i) {
  const Job *j = (const Job *)data;
  size_t c = i % j->channels;
  const float *x = j->x + i * j->inner;
  float *y = j->y + i * j->inner;
  const float a = j->a[c], b = j->inv_b[c];
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  size_t t = 0;
  for (; t + 8 <= j->inner; t += 8) {
    __m256 xv = _mm256_loadu_ps(x + t);
    __m256 s2 = sin2_avx(_mm256_mul_ps(xv, va));
    _mm256_storeu_ps(y + t, _mm256_fmadd_ps(vb, s2, xv));
  }
  for (; t < j->inner; ++t) y[t] = fmaf(b, sin2_scalar(x[t] * a), x[t]);
}

#define CHECK(expr)                                        \
  do {                                                     \
    OrtStatus *st_ = (expr);                               \
    if (st_) { g_api->ReleaseStatus(st_); return; }        \
  } while (0)

static void compute(void *kernel, OrtKernelContext *ctx) {
  (void)kernel;
  const OrtValue *xin, *ain, *bin;
  CHECK(g_api->KernelContext_GetInput(ctx, 0, &xin));
  CHECK(g_api->KernelContext_GetInput(ctx, 1, &ain));
  CHECK(g_api->KernelContext_GetInput(ctx, 2, &bin));
  OrtTensorTypeAndShapeInfo *info;
  CHECK(g_api->GetTensorTypeAndShape(xin, &info));
  size_t rank;
  int64_t dims[8];
  CHECK(g_api->GetDimensionsCount(info, &rank));
  CHECK(g_api->GetDimensions(info, dims, rank));
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  OrtValue *out;
  CHECK(g_api->KernelContext_GetOutput(ctx, 0, dims, rank, &out));
  Job j;
  void *p;
  CHECK(g_api->GetTensorMutableData((OrtValue *)xin, &p)); j.x = (const float *)p;
  CHECK(g_api->GetTensorMutableData((OrtValue *)ain, &p)); j.a = (const float *)p;
  CHECK(g_api->GetTensorMutableData((OrtValue *)bin, &p)); j.inv_b = (const float *)p;
  CHECK(g_api->GetTensorMutableData(out, &p)); j.y = (float *)p;
  j.channels = (size_t)dims[1];
  j.inner = 1;
  for (size_t d = 2; d < rank; ++d) j.inner *= (size_t)dims[d];
  size_t rows = (size_t)dims[0] * j.channels;
  if (rows * j.inner < 16384) {
    for (size_t i = 0; i < rows; ++i) row(&j, i);
  } else {
    CHECK(g_api->KernelContext_ParallelFor(ctx, row, rows, 0, &j));
  }
}

static void *create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
  (void)op; (void)api; (void)info;
  return (void *)1;
}
static const char *get_name(const OrtCustomOp *op) { (void)op; return "SnakeBeta"; }
static const char *get_ep(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static ONNXTensorElementDataType get_type(const OrtCustomOp *op, size_t i) {
  (void)op; (void)i; return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t n_inputs(const OrtCustomOp *op) { (void)op; return 3; }
static size_t n_outputs(const OrtCustomOp *op) { (void)op; return 1; }
static void destroy(void *k) { (void)k; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) {
  (void)op; (void)i; return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType mem_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }

static OrtCustomOp g_op;
static OrtCustomOpDomain *g_domain;

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  g_api = base->GetApi(17);
  if (!g_api) return NULL;
  memset(&g_op, 0, sizeof g_op);
  g_op.version = 17;
  g_op.CreateKernel = create_kernel;
  g_op.GetName = get_name;
  g_op.GetExecutionProviderType = get_ep;
  g_op.GetInputType = get_type;
  g_op.GetInputTypeCount = n_inputs;
  g_op.GetOutputType = get_type;
  g_op.GetOutputTypeCount = n_outputs;
  g_op.KernelCompute = compute;
  g_op.KernelDestroy = destroy;
  g_op.GetInputCharacteristic = required;
  g_op.GetOutputCharacteristic = required;
  g_op.GetInputMemoryType = mem_type;
  OrtStatus *st;
  if (!g_domain) {
    if ((st = g_api->CreateCustomOpDomain("qtts.perf", &g_domain))) return st;
    if ((st = g_api->CustomOpDomain_Add(g_domain, &g_op))) return st;
  }
  return g_api->AddCustomOpDomain(options, g_domain);
}
