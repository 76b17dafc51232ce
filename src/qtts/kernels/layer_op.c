/* qtts kernels: the onnxruntime op qtts.kernels::DecoderLayer (CPU, 21 inputs, 3 outputs) and its
 * plain-array entry points for ctypes. The math is in layer.c; the contract:
 *
 *   0 x float [1, T, H] (T 1 or 2)        1 past_k, 2 past_v float [1, kvh, P, D] (P >= 0)
 *   3 seqlens_k int32, 4 total_len int32 (ignored: the graph's fallback body reads them)
 *   5 cos, 6 sin float [L, D/2] (L >= P + T)   7 input_norm float [H]
 *   8 qkv_q uint8 [(heads + 2 kvh) D, H/128, 128], 9 qkv_s float [(heads + 2 kvh) D, H/128]
 *   10 q_norm, 11 k_norm float [D]             12 o_q uint8 [H, heads D/128, 128], 13 o_s
 *   14 post_norm float [H]                     15 gu_q uint8 [2 I, H/128, 128], 16 gu_s
 *   17 ha float [a, a], 18 hb float [b, b] (I = m a b)   19 down_q uint8 [H, I/128, 128], 20 down_s
 *   outputs: y float [1, T, H], present_k, present_v float [1, kvh, P + T, D]
 *
 * Scales may also be flat ([N * blocks], MatMulNBits' own layout). D is q_norm's length, kvh
 * past_k's dim 1, heads qkv rows / D - 2 kvh, I gu rows / 2; H, heads D and I are multiples of
 * 128 and at most 131072; heads a multiple of kvh; b <= 4096. Anything else is an
 * InvalidArgument status naming the input. RMSNorm's epsilon is fixed at 1e-6 (rms_norm_eps of
 * every Qwen3-TTS code predictor): there is no input for it.
 */
#include <stdio.h>
#include <string.h>

#include "layer.h"
#include "ort_abi.h"

static const char *const NAMES[LAYER_INPUTS] = {
    "x",      "past_k", "past_v", "seqlens_k", "total_len", "cos",  "sin", "input_norm", "qkv_q", "qkv_s", "q_norm",
    "k_norm", "o_q",    "o_s",    "post_norm", "gu_q",      "gu_s", "ha",  "hb",         "down_q", "down_s"};
enum { F32 = QTTS_ORT_FLOAT, U8 = QTTS_ORT_UINT8, I32 = QTTS_ORT_INT32 };
static const int TYPES[LAYER_INPUTS] = {F32, F32, F32, I32, I32, F32, F32, F32, U8, F32, F32,
                                        F32, U8,  F32, F32, U8,  F32, F32, F32, U8, F32};

#define RANK(i) sh[(i) * 5]
#define DIM(i, k) sh[(i) * 5 + 1 + (k)]

static void shape_text(const int64_t *s, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int64_t k = 0; k < s[0] && used < n; ++k)
    used += (size_t)snprintf(buf + used, n - used, k ? ", %lld" : "%lld", (long long)s[1 + k]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

static int bad(const int64_t *sh, int i, const char *want, char *err, size_t errlen) {
  char got[128];
  shape_text(sh + i * 5, got, sizeof got);
  snprintf(err, errlen, "qtts.kernels DecoderLayer: input %d (%s) must be %s, got %s", i, NAMES[i], want, got);
  return -1;
}

/* Input i is exactly [want[0], ..., want[rank - 1]]; else the message. */
static int expect(const int64_t *sh, int i, int rank, const int64_t *want, char *err, size_t errlen) {
  int ok = RANK(i) == rank;
  for (int k = 0; ok && k < rank; ++k) ok = DIM(i, k) == want[k];
  if (ok) return 0;
  int64_t w[5] = {rank, 0, 0, 0, 0};
  char text[128];
  memcpy(w + 1, want, (size_t)rank * sizeof *want);
  shape_text(w, text, sizeof text);
  return bad(sh, i, text, err, errlen);
}
#define EXPECT(i, rank, ...) \
  if (expect(sh, i, rank, (const int64_t[]){__VA_ARGS__}, err, errlen)) return -1

/* A MatMulNBits weight q [n, blocks, 128] and its scales [n, blocks] (or flat [n * blocks]). */
static int expect_weight(const int64_t *sh, int i, int64_t n, int64_t k, char *err, size_t errlen) {
  char want[96];
  EXPECT(i, 3, n, k / QBLOCK, QBLOCK);
  if ((RANK(i + 1) == 2 && DIM(i + 1, 0) == n && DIM(i + 1, 1) == k / QBLOCK) ||
      (RANK(i + 1) == 1 && DIM(i + 1, 0) == n * (k / QBLOCK)))
    return 0;
  snprintf(want, sizeof want, "[%lld, %lld] (or [%lld])", (long long)n, (long long)(k / QBLOCK),
           (long long)(n * (k / QBLOCK)));
  return bad(sh, i + 1, want, err, errlen);
}

static int k_ok(int64_t k) { return k >= QBLOCK && k % QBLOCK == 0 && k / QBLOCK <= LAYER_MAX_BLOCKS; }

/* x, past_k / past_v, q_norm, cos / sin: T, H, P, kvh, D, L. */
static int attention_dims(const int64_t *sh, LayerDims *d, char *err, size_t errlen) {
  if (RANK(IN_X) != 3 || DIM(IN_X, 0) != 1 || DIM(IN_X, 1) < 1 || DIM(IN_X, 1) > LAYER_MAX_T || !k_ok(DIM(IN_X, 2)))
    return bad(sh, IN_X, "[1, T, H] with T 1 or 2 and H a multiple of 128 (<= 131072)", err, errlen);
  d->T = (size_t)DIM(IN_X, 1), d->H = (size_t)DIM(IN_X, 2);
  if (RANK(IN_Q_NORM) != 1 || DIM(IN_Q_NORM, 0) < 2 || DIM(IN_Q_NORM, 0) % 2)
    return bad(sh, IN_Q_NORM, "[D] with D even (the head size)", err, errlen);
  int64_t D = DIM(IN_Q_NORM, 0);
  if (RANK(IN_PAST_K) != 4 || DIM(IN_PAST_K, 0) != 1 || DIM(IN_PAST_K, 1) < 1 || DIM(IN_PAST_K, 2) < 0 ||
      DIM(IN_PAST_K, 3) != D)
    return bad(sh, IN_PAST_K, "[1, kvh, P, D] with D q_norm's length", err, errlen);
  d->D = (size_t)D, d->kvh = (size_t)DIM(IN_PAST_K, 1), d->P = (size_t)DIM(IN_PAST_K, 2);
  EXPECT(IN_PAST_V, 4, 1, DIM(IN_PAST_K, 1), DIM(IN_PAST_K, 2), D);
  EXPECT(IN_K_NORM, 1, D);
  if (RANK(IN_COS) != 2 || DIM(IN_COS, 0) < (int64_t)(d->P + d->T) || DIM(IN_COS, 1) != D / 2)
    return bad(sh, IN_COS, "[L, D/2] with L >= P + T (a row per position)", err, errlen);
  d->L = (size_t)DIM(IN_COS, 0);
  EXPECT(IN_SIN, 2, DIM(IN_COS, 0), D / 2);
  return 0;
}

int qtts_layer_dims(const int64_t *sh, LayerDims *d, char *err, size_t errlen) {
  if (attention_dims(sh, d, err, errlen)) return -1;
  const int64_t H = (int64_t)d->H, D = (int64_t)d->D, kvh = (int64_t)d->kvh;
  EXPECT(IN_NORM1, 1, H);
  EXPECT(IN_NORM2, 1, H);
  int64_t heads = RANK(IN_QKV_Q) == 3 && DIM(IN_QKV_Q, 0) % D == 0 ? DIM(IN_QKV_Q, 0) / D - 2 * kvh : 0;
  if (heads < 1 || heads % kvh || !k_ok(heads * D))
    return bad(sh, IN_QKV_Q, "[(heads + 2 kvh) D, H/128, 128] with heads a multiple of kvh, heads D of 128",
               err, errlen);
  if (expect_weight(sh, IN_QKV_Q, (heads + 2 * kvh) * D, H, err, errlen)) return -1;
  if (expect_weight(sh, IN_O_Q, H, heads * D, err, errlen)) return -1;
  int64_t I = RANK(IN_GU_Q) == 3 && DIM(IN_GU_Q, 0) % 2 == 0 ? DIM(IN_GU_Q, 0) / 2 : 0;
  if (!k_ok(I)) return bad(sh, IN_GU_Q, "[2 I, H/128, 128] with I a multiple of 128", err, errlen);
  if (expect_weight(sh, IN_GU_Q, 2 * I, H, err, errlen)) return -1;
  if (RANK(IN_HA) != 2 || DIM(IN_HA, 0) < 1 || DIM(IN_HA, 1) != DIM(IN_HA, 0))
    return bad(sh, IN_HA, "[a, a]", err, errlen);
  if (RANK(IN_HB) != 2 || DIM(IN_HB, 0) < 1 || DIM(IN_HB, 0) > LAYER_MAX_B || DIM(IN_HB, 1) != DIM(IN_HB, 0) ||
      I % (DIM(IN_HA, 0) * DIM(IN_HB, 0)))
    return bad(sh, IN_HB, "[b, b] with I a multiple of a b (b <= 4096)", err, errlen);
  if (expect_weight(sh, IN_DOWN_Q, H, I, err, errlen)) return -1;
  d->heads = (size_t)heads, d->I = (size_t)I, d->a = (size_t)DIM(IN_HA, 0), d->b = (size_t)DIM(IN_HB, 0);
  return 0;
}

/* ----------------------------------------------------------------------------- ctypes */
/* The derived sizes {T, H, P, kvh, D, heads, I, a, b, L} of inputs shaped shapes[21 * 5] (rank,
 * then up to 4 dims each): 0, or -1 with the reason in err. */
int qtts_decoder_layer_dims(const int64_t *shapes, int64_t *dims, char *err, size_t errlen) {
  LayerDims d;
  if (qtts_layer_dims(shapes, &d, err, errlen)) return -1;
  const size_t v[10] = {d.T, d.H, d.P, d.kvh, d.D, d.heads, d.I, d.a, d.b, d.L};
  for (int i = 0; i < 10; ++i) dims[i] = (int64_t)v[i];
  return 0;
}

/* The op on plain arrays: inputs[21] in the op's order (3, 4 may be NULL), outputs[3] y,
 * present_k, present_v (sized from qtts_decoder_layer_dims). isa: NULL for the path in use, else
 * "avx512" | "avx2" | "generic". 0; -1 that path is unavailable here; -2 bad shapes (err says
 * which); -3 out of memory. */
int qtts_decoder_layer(const int64_t *shapes, const void *const *inputs, float *const *outputs, const char *isa,
                       char *err, size_t errlen) {
  const char *name;
  DotFn dot = qtts_dot_pick(isa, &name);
  LayerDims d;
  if (!dot) return snprintf(err, errlen, "the '%s' path is not available on this CPU", isa), -1;
  if (qtts_layer_dims(shapes, &d, err, errlen)) return -2;
  if (qtts_layer_run(&d, inputs, outputs, dot)) return snprintf(err, errlen, "out of memory"), -3;
  return 0;
}

/* ----------------------------------------------------------------------------- the ORT op */
static const QttsOrtApi *g_api;

static Status invalid(const char *msg) { return g_api->CreateStatus(QTTS_ORT_INVALID_ARGUMENT, msg); }

/* Input i's data, type-checked, and its shape as (rank, dims) into s[5]. */
static Status read_input(OrtKernelContext *ctx, int i, int64_t *s, const void **data) {
  const OrtValue *v;
  OrtTensorTypeAndShapeInfo *info;
  size_t rank = 0;
  int type = 0;
  void *p = NULL;
  char msg[160];
  QTTS_TRY(g_api->KernelContext_GetInput(ctx, (size_t)i, &v));
  QTTS_TRY(g_api->GetTensorTypeAndShape(v, &info));
  Status st = g_api->GetTensorElementType(info, &type);
  if (!st) st = g_api->GetDimensionsCount(info, &rank);
  if (!st && rank <= 4) st = g_api->GetDimensions(info, s + 1, rank);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (st) return st;
  if (type != TYPES[i] || (rank > 4 && i != IN_SEQLENS && i != IN_TOTAL)) {
    snprintf(msg, sizeof msg, "qtts.kernels DecoderLayer: input %d (%s) must be a %s tensor of rank <= 4", i,
             NAMES[i], TYPES[i] == U8 ? "uint8" : TYPES[i] == I32 ? "int32" : "float");
    return invalid(msg);
  }
  s[0] = (int64_t)(rank <= 4 ? rank : 0);
  QTTS_TRY(g_api->GetTensorMutableData((OrtValue *)v, &p));
  *data = p;
  return NULL;
}

static Status output(OrtKernelContext *ctx, size_t i, const int64_t *dims, size_t rank, float **data) {
  OrtValue *v;
  void *p;
  QTTS_TRY(g_api->KernelContext_GetOutput(ctx, i, dims, rank, &v));
  QTTS_TRY(g_api->GetTensorMutableData(v, &p));
  *data = p;
  return NULL;
}

static Status compute(void *kernel, OrtKernelContext *ctx) {
  (void)kernel;
  int64_t sh[LAYER_INPUTS * 5] = {0};
  const void *in[LAYER_INPUTS];
  float *out[3];
  LayerDims d;
  char err[320];
  const char *name;
  for (int i = 0; i < LAYER_INPUTS; ++i) QTTS_TRY(read_input(ctx, i, sh + i * 5, &in[i]));
  if (qtts_layer_dims(sh, &d, err, sizeof err)) return invalid(err);
  const int64_t y[3] = {1, (int64_t)d.T, (int64_t)d.H};
  const int64_t present[4] = {1, (int64_t)d.kvh, (int64_t)(d.P + d.T), (int64_t)d.D};
  QTTS_TRY(output(ctx, 0, y, 3, &out[0]));
  QTTS_TRY(output(ctx, 1, present, 4, &out[1]));
  QTTS_TRY(output(ctx, 2, present, 4, &out[2]));
  if (qtts_layer_run(&d, in, out, qtts_dot_pick(NULL, &name)))
    return g_api->CreateStatus(QTTS_ORT_FAIL, "qtts.kernels DecoderLayer: out of memory");
  return NULL;
}

static Status create_kernel(const OrtCustomOp *op, const QttsOrtApi *api, const OrtKernelInfo *info, void **k) {
  (void)op, (void)api, (void)info;
  *k = (void *)1; /* stateless: the weights are inputs (initializers) */
  return NULL;
}
static const char *op_name(const OrtCustomOp *op) { (void)op; return "DecoderLayer"; }
static const char *op_ep(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int op_in_type(const OrtCustomOp *op, size_t i) { (void)op; return i < LAYER_INPUTS ? TYPES[i] : 0; }
static int op_out_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return QTTS_ORT_FLOAT; }
static size_t op_inputs(const OrtCustomOp *op) { (void)op; return LAYER_INPUTS; }
static size_t op_outputs(const OrtCustomOp *op) { (void)op; return 3; }
static int op_zero(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int op_start(const OrtCustomOp *op) { (void)op; return 1; }
static int op_end(const OrtCustomOp *op) { (void)op; return 2147483647; }
static void op_destroy(void *k) { (void)k; }

static OrtCustomOp g_op;

const OrtCustomOp *qtts_layer_custom_op(const QttsOrtApi *api) {
  if (!g_api) {
    const char *name;
    g_api = api;
    qtts_dot_pick(NULL, &name); /* the path is picked now, at registration, like SnakeBeta's */
    g_op.version = QTTS_ORT_API;
    g_op.GetName = op_name;
    g_op.GetExecutionProviderType = op_ep;
    g_op.GetInputType = op_in_type;
    g_op.GetInputTypeCount = op_inputs;
    g_op.GetOutputType = op_out_type;
    g_op.GetOutputTypeCount = op_outputs;
    g_op.KernelDestroy = op_destroy;
    g_op.GetInputCharacteristic = op_zero;
    g_op.GetOutputCharacteristic = op_zero;
    g_op.GetInputMemoryType = op_zero;
    g_op.CreateKernelV2 = create_kernel;
    g_op.KernelComputeV2 = compute;
    g_op.GetStartVersion = op_start;
    g_op.GetEndVersion = op_end;
  }
  return &g_op;
}
