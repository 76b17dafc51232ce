/* qtts kernels: the internal interfaces of the DecoderLayer op (layer.c, layer_dot.c, layer_pool.c,
 * layer_op.c). Nothing here is exported from the library: the entry points are declared where
 * they are defined (qtts_decoder_layer, qtts_gemv_q8, qtts_layer_threads, qtts_layer_spin_us, qtts_layer_isa).
 */
#ifndef QTTS_LAYER_H
#define QTTS_LAYER_H

#include <stddef.h>
#include <stdint.h>

#define QTTS_HIDDEN __attribute__((visibility("hidden")))

#define QBLOCK 128      /* MatMulNBits block_size: the K values that share one weight scale */
#define LAYER_EPS 1e-6f /* RMSNorm epsilon: rms_norm_eps of every Qwen3-TTS code predictor */
#define LAYER_INPUTS 21
#define LAYER_MAX_T 2   /* new positions per call: 1 (a step) or 2 (the first pass) */
#define LAYER_MAX_BLOCKS 1024 /* K <= 131072: a GEMV row's dots fit its buffer */
#define LAYER_MAX_B 4096      /* hb at most [4096, 4096]: a rotated row fits its buffer */

/* The op's inputs, in order (3 and 4, seqlens_k and total_len, are for the fallback body only). */
enum {
  IN_X, IN_PAST_K, IN_PAST_V, IN_SEQLENS, IN_TOTAL, IN_COS, IN_SIN, IN_NORM1, IN_QKV_Q, IN_QKV_S, IN_Q_NORM,
  IN_K_NORM, IN_O_Q, IN_O_S, IN_NORM2, IN_GU_Q, IN_GU_S, IN_HA, IN_HB, IN_DOWN_Q, IN_DOWN_S
};

/* One quantized activation: T rows of K = nb * 128 values, quantized per block of 128 as
 * onnxruntime's MatMulNBits (accuracy_level 4) quantizes its input. The per-block values are
 * stored QSTRIDE(nb) apart per row, the first nb of them repeated after the nb-th, so a vector
 * path loads the values of any 16 consecutive blocks (wrapping past the last) in one go. */
#define QSTRIDE(nb) ((nb) + 16)
typedef struct {
  int T;
  size_t nb;             /* blocks of 128 along K */
  const int8_t *q;       /* [T][K] codes in [-127, 127] */
  const int16_t *q16;    /* the same codes widened (the AVX2 path's operand), or NULL */
  const float *scale;    /* [T][QSTRIDE(nb)] amax / 127 of block j % nb */
  const int32_t *corr;   /* [T][QSTRIDE(nb)] 128 * the codes' sum in block j % nb (the zero point) */
} QAct;

/* Block products of n consecutive 128-byte weight chunks (chunk c of row-major [rows][nb][128]
 * weights starting at a row: block b = c % nb) with their scales s[c] (the same flat order):
 *   out[t * n + c] = (s[c] * scale[t][b]) * (float)(sum_k w[c * 128 + k] * q[t][b * 128 + k] - corr[t][b])
 * (w as unsigned codes): the dot exact in int32, the two multiplies in that order, on every path. */
typedef void (*DotFn)(const uint8_t *w, const float *s, size_t n, const QAct *a, float *out);

/* layer_dot.c: the dot path for an ISA name (NULL or "": QTTS_KERNELS_ISA at first use, else the
 * best); NULL when this CPU lacks the one named. *name: the path's name. */
QTTS_HIDDEN DotFn qtts_dot_pick(const char *isa, const char **name);
QTTS_HIDDEN int qtts_dot_wants16(DotFn dot);

/* layer_dot.c: out[t][n] = MatMulNBits(a row t; q [rows][nb][128] uint8, s [rows][nb]) for
 * n < rows, the rows split over the pool's threads. */
QTTS_HIDDEN void qtts_gemv(const uint8_t *q, const float *s, size_t rows, const QAct *a, float *out, DotFn dot);
/* The same, and glu [t][i] = silu(out[t][i]) * out[t][rows/2 + i] (i < rows / 2), on the same threads. */
QTTS_HIDDEN void qtts_gemv_glu(const uint8_t *q, const float *s, size_t rows, const QAct *a, float *out, float *glu,
                               DotFn dot);

/* layer_pool.c: fn(ctx, u) for u < units, spread over the caller and the pool's workers; returns
 * when all are done. One job at a time: callers serialise (layer.c holds its lock). */
typedef void (*TaskFn)(void *ctx, size_t unit);
QTTS_HIDDEN void qtts_pool_run(TaskFn fn, void *ctx, size_t units);
QTTS_HIDDEN int qtts_pool_size(void);

/* The layer's sizes, derived from its inputs' shapes (layer_op.c). */
typedef struct {
  size_t T, H, P, kvh, D, heads, I, a, b, L;
} LayerDims;

/* layer_op.c: the sizes from the 21 inputs' shapes, shapes[i * 5] = rank, then up to 4 dims.
 * 0, or -1 with what is wrong (naming the input) in err. */
QTTS_HIDDEN int qtts_layer_dims(const int64_t *shapes, LayerDims *d, char *err, size_t errlen);

/* layer.c: the layer on plain arrays: in[i] the 21 inputs in the op's order (3 and 4 unused),
 * out[0..2] y, present_k, present_v. 0, or -1 when out of memory. */
QTTS_HIDDEN int qtts_layer_run(const LayerDims *d, const void *const *in, float *const *out, DotFn dot);

#endif
