/* The few pieces of the onnxruntime C ABI that qtts's kernels use, declared here so that the
 * library builds from this folder alone (no onnxruntime headers needed).
 *
 * onnxruntime's C API is a table of function pointers (OrtApi) that only ever grows at its end,
 * so a slot's position never changes: the slot numbers below hold for every release with API
 * version >= QTTS_ORT_API (1.17, the first with KernelContext_ParallelFor). The library asks
 * for that version and never touches a later slot. OrtCustomOp is filled up to its version-17
 * fields; the rest stay zero.
 */
#ifndef QTTS_ORT_ABI_H
#define QTTS_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

#define QTTS_ORT_API 17

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtCustomOp OrtCustomOp;

enum { QTTS_ORT_FAIL = 1, QTTS_ORT_INVALID_ARGUMENT = 2 }; /* OrtErrorCode values */
enum { QTTS_ORT_FLOAT = 1, QTTS_ORT_UINT8 = 2, QTTS_ORT_INT32 = 6 }; /* ONNXTensorElementDataType */

typedef OrtStatus *Status;
#define SLOT(ret, name, args) ret (*name) args
#define GAP(from, to) void *gap_##from[(to) - (from)]

/* OrtApi, slot numbers in the comments. */
typedef struct QttsOrtApi {
  SLOT(OrtStatus *, CreateStatus, (int code, const char *msg));                             /* 0 */
  GAP(1, 26);
  SLOT(Status, CreateCustomOpDomain, (const char *domain, OrtCustomOpDomain **out));        /* 26 */
  SLOT(Status, CustomOpDomain_Add, (OrtCustomOpDomain *domain, const OrtCustomOp *op));     /* 27 */
  SLOT(Status, AddCustomOpDomain, (OrtSessionOptions *options, OrtCustomOpDomain *domain)); /* 28 */
  GAP(29, 51);
  SLOT(Status, GetTensorMutableData, (OrtValue *value, void **out));                        /* 51 */
  GAP(52, 60);
  SLOT(Status, GetTensorElementType, (const OrtTensorTypeAndShapeInfo *info, int *out));    /* 60 */
  SLOT(Status, GetDimensionsCount, (const OrtTensorTypeAndShapeInfo *info, size_t *out));   /* 61 */
  SLOT(Status, GetDimensions, (const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n)); /* 62 */
  GAP(63, 64);
  SLOT(Status, GetTensorShapeElementCount, (const OrtTensorTypeAndShapeInfo *info, size_t *out)); /* 64 */
  SLOT(Status, GetTensorTypeAndShape, (const OrtValue *value, OrtTensorTypeAndShapeInfo **out));  /* 65 */
  GAP(66, 90);
  SLOT(Status, KernelContext_GetInput, (const OrtKernelContext *ctx, size_t i, const OrtValue **out)); /* 90 */
  SLOT(Status, KernelContext_GetOutput,
       (OrtKernelContext *ctx, size_t i, const int64_t *dims, size_t n, OrtValue **out));  /* 91 */
  GAP(92, 93);
  SLOT(void, ReleaseStatus, (OrtStatus *status));                                          /* 93 */
  GAP(94, 99);
  SLOT(void, ReleaseTensorTypeAndShapeInfo, (OrtTensorTypeAndShapeInfo *info));            /* 99 */
  GAP(100, 274);
  SLOT(Status, KernelContext_ParallelFor,
       (const OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t total, size_t batches, void *data)); /* 274 */
} QttsOrtApi;

#define SLOT_AT(name, n) _Static_assert(offsetof(QttsOrtApi, name) == (n) * sizeof(void *), #name)
SLOT_AT(CreateCustomOpDomain, 26);
SLOT_AT(GetTensorMutableData, 51);
SLOT_AT(GetTensorElementType, 60);
SLOT_AT(GetTensorTypeAndShape, 65);
SLOT_AT(KernelContext_GetInput, 90);
SLOT_AT(ReleaseStatus, 93);
SLOT_AT(ReleaseTensorTypeAndShapeInfo, 99);
SLOT_AT(KernelContext_ParallelFor, 274);

typedef struct OrtApiBase {
  const QttsOrtApi *(*GetApi)(uint32_t version);
  const char *(*GetVersionString)(void);
} OrtApiBase;

struct OrtCustomOp {
  uint32_t version;
  void *(*CreateKernel)(const OrtCustomOp *op, const QttsOrtApi *api, const OrtKernelInfo *info);
  const char *(*GetName)(const OrtCustomOp *op);
  const char *(*GetExecutionProviderType)(const OrtCustomOp *op);
  int (*GetInputType)(const OrtCustomOp *op, size_t i);
  size_t (*GetInputTypeCount)(const OrtCustomOp *op);
  int (*GetOutputType)(const OrtCustomOp *op, size_t i);
  size_t (*GetOutputTypeCount)(const OrtCustomOp *op);
  void (*KernelCompute)(void *kernel, OrtKernelContext *ctx);
  void (*KernelDestroy)(void *kernel);
  int (*GetInputCharacteristic)(const OrtCustomOp *op, size_t i);  /* 0: required */
  int (*GetOutputCharacteristic)(const OrtCustomOp *op, size_t i);
  int (*GetInputMemoryType)(const OrtCustomOp *op, size_t i);      /* 0: the EP's default */
  int (*GetVariadicInputMinArity)(const OrtCustomOp *op);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp *op);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp *op);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp *op);
  Status (*CreateKernelV2)(const OrtCustomOp *op, const QttsOrtApi *api, const OrtKernelInfo *info, void **kernel);
  Status (*KernelComputeV2)(void *kernel, OrtKernelContext *ctx);
  Status (*InferOutputShapeFn)(const OrtCustomOp *op, void *ctx);
  int (*GetStartVersion)(const OrtCustomOp *op);
  int (*GetEndVersion)(const OrtCustomOp *op);
  void *later[4]; /* MayInplace / AliasMap (versions 18+), unused */
};

/* Return a failed OrtStatus from the enclosing function. */
#define QTTS_TRY(expr)   \
  do {                   \
    Status st_ = (expr); \
    if (st_) return st_; \
  } while (0)

/* The library's second op, qtts.kernels::DecoderLayer (layer_op.c): filled on first use with api,
 * added to the domain by RegisterCustomOps (snake.c). */
__attribute__((visibility("hidden"))) const OrtCustomOp *qtts_layer_custom_op(const QttsOrtApi *api);

#endif
