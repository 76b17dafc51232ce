/* qtts kernels: one Qwen3 decoder layer of the code predictor (the DecoderLayer op), batch 1 and
 * T = 1 or 2 new positions, int8 weights in MatMulNBits layout, fp32 everything else:
 *
 *   h = rmsnorm(x) * input_norm;  q, k, v = gemv(h; qkv)
 *   q, k = rope(rmsnorm(q|k per head) * q_norm|k_norm);  present = past + the new k, v rows
 *   attn = softmax(q k^T / sqrt(D)) v   (causal, grouped: query head j reads kv head j / (heads/kvh))
 *   x2 = x + gemv(attn; o);  g, u = gemv(rmsnorm(x2) * post_norm; gate_up)
 *   y = x2 + gemv(rotate(silu(g) * u); down)    rotate: each [a, b] block X of the [m, a, b] view -> ha X hb
 *
 * RMSNorm eps is 1e-6 (LAYER_EPS). The GEMVs (layer_dot.c, with silu(g) * u in the gate_up one)
 * and the rotation run on the library's own threads (layer_pool.c); the rest is serial C here.
 * All of it is written so that it vectorises without changing the
 * order of any float sum (sums run over 16 fixed partial lanes, elementwise loops are lane
 * independent) and is the same code for every ISA path: the paths differ only in exact integer
 * dots, so their outputs are bitwise equal. One layer runs at a time per process (g_lock): the
 * pool has one job slot, and the scratch buffer is shared; a second caller waits its turn.
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: (v + M) - M rounds |v| < 2^22 to nearest, ties to even */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_scratch; /* grow-only, under g_lock: no malloc (nor mmap page faults) per call */
static size_t g_scratch_size;

typedef struct {
  float *h, *qkv, *attn, *x2, *proj, *gu, *act, *rot, *scores, *scale; /* rot: act rotated */
  int8_t *q;
  int16_t *q16;
  int32_t *corr;
  DotFn dot;
} Work;

/* ----------------------------------------------------------------------------- small pieces */
static float dot_f(const float *a, const float *b, size_t n) {
  float p[16] = {0}, s = 0.0f;
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) p[l] += a[i + l] * b[i + l];
  for (int l = 0; l < 16; ++l) s += p[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

static void rmsnorm(const float *x, const float *w, size_t n, float *out) {
  float r = 1.0f / sqrtf(dot_f(x, x, n) / (float)n + LAYER_EPS);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] * r) * w[i];
}

/* MatMulNBits' activation quantization of one block of 128: scale amax / 127, codes
 * round-half-even(x * (127 / amax)) (MLAS multiplies by that reciprocal, so do we). */
static int32_t quantize_block(const float *x, int8_t *q, float *scale) {
  float m[16] = {0}, amax = 0.0f;
  for (int k = 0; k < QBLOCK; k += 16)
    for (int l = 0; l < 16; ++l) m[l] = fabsf(x[k + l]) > m[l] ? fabsf(x[k + l]) : m[l];
  for (int l = 0; l < 16; ++l) amax = m[l] > amax ? m[l] : amax;
  *scale = amax / 127.0f;
  float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
  int32_t sum = 0;
  for (int k = 0; k < QBLOCK; ++k) {
    float v = x[k] * inv, r = v + ROUND_MAGIC;
    r -= ROUND_MAGIC;
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    q[k] = (int8_t)(r == r ? (int)r : 0); /* NaN (only from a NaN or inf input) -> 0 */
    sum += q[k];
  }
  return sum;
}

/* T rows of K values -> the QAct the GEMVs read (widened codes too when the path wants them). */
static QAct quantize(const Work *w, const float *x, size_t T, size_t K) {
  const size_t nb = K / QBLOCK, st = QSTRIDE(nb);
  for (size_t t = 0; t < T; ++t) {
    float *scale = w->scale + t * st;
    int32_t *corr = w->corr + t * st;
    for (size_t b = 0; b < nb; ++b) {
      size_t i = t * K + b * QBLOCK;
      corr[b] = 128 * quantize_block(x + i, w->q + i, scale + b);
    }
    for (size_t j = nb; j < st; ++j) scale[j] = scale[j % nb], corr[j] = corr[j % nb];
  }
  int wide = qtts_dot_wants16(w->dot);
  if (wide)
    for (size_t i = 0; i < T * K; ++i) w->q16[i] = w->q[i];
  QAct a = {(int)T, nb, w->q, wide ? w->q16 : NULL, w->scale, w->corr};
  return a;
}

/* Rotate-half RoPE of one head u [D] at the position whose half tables are c, s [D/2]. */
static void rope(float *u, const float *c, const float *s, size_t D) {
  size_t half = D / 2;
  for (size_t i = 0; i < half; ++i) {
    float lo = u[i], hi = u[i + half];
    u[i] = lo * c[i] - hi * s[i];
    u[i + half] = hi * c[i] + lo * s[i];
  }
}

/* One query row q [D] over positions 0 .. npos-1 of one kv head (k, v [npos][D]) -> out [D]. */
static void attend(const float *q, const float *k, const float *v, size_t npos, size_t D, float *scores,
                   float *out) {
  float scale = 1.0f / sqrtf((float)D), mx = -INFINITY, sum = 0.0f;
  for (size_t p = 0; p < npos; ++p) {
    scores[p] = dot_f(q, k + p * D, D) * scale;
    mx = scores[p] > mx ? scores[p] : mx;
  }
  for (size_t p = 0; p < npos; ++p) sum += scores[p] = expf(scores[p] - mx);
  memset(out, 0, D * sizeof *out);
  for (size_t p = 0; p < npos; ++p) {
    float wp = scores[p] / sum;
    for (size_t i = 0; i < D; ++i) out[i] += wp * v[p * D + i];
  }
}

/* out [n] = v [k] @ M [k][n]: each out[j] summed over i = 0, 1, ... in order, 16 columns at a
 * time in a local block the compiler keeps in vector registers. */
static void vec_mat(const float *v, const float *M, size_t k, size_t n, float *out) {
  size_t j = 0;
  for (; j + 16 <= n; j += 16) {
    float acc[16] = {0};
    for (size_t i = 0; i < k; ++i)
      for (int l = 0; l < 16; ++l) acc[l] += v[i] * M[i * n + j + l];
    memcpy(out + j, acc, sizeof acc);
  }
  for (; j < n; ++j) {
    float acc = 0.0f;
    for (size_t i = 0; i < k; ++i) acc += v[i] * M[i * n + j];
    out[j] = acc;
  }
}

/* The intermediate's rotation, Y = ha @ X @ hb for each [a, b] block X of the [m, a, b] view of
 * each row: output row i of a block is (ha[i] @ X) @ hb, independent of the others, so the rows
 * are the units the threads share. */
typedef struct {
  const float *src, *ha, *hb;
  float *dst;
  size_t a, b, split; /* split: units per block */
} Rotation;

static void rotate_unit(void *ctx, size_t u) {
  const Rotation *r = ctx;
  const size_t ab = r->a * r->b, blk = u / r->split, part = u % r->split;
  const size_t per = (r->a + r->split - 1) / r->split, end = (part + 1) * per < r->a ? (part + 1) * per : r->a;
  float tmp[LAYER_MAX_B];
  for (size_t i = part * per; i < end; ++i) {
    vec_mat(r->ha + i * r->a, r->src + blk * ab, r->a, r->b, tmp);
    vec_mat(tmp, r->hb, r->b, r->b, r->dst + blk * ab + i * r->b);
  }
}

/* ----------------------------------------------------------------------------- the layer */
#define F(i) ((const float *)in[i])
#define U8(i) ((const uint8_t *)in[i])

/* Row t's q and k: per-head RMSNorm, then RoPE at position P + t; its k and v rows into present. */
static void qk_rows(const LayerDims *d, const void *const *in, float *qkv, size_t t, float *pk, float *pv) {
  const size_t D = d->D, pos = d->P + t, total = d->P + d->T;
  const float *c = F(IN_COS) + pos * (D / 2), *s = F(IN_SIN) + pos * (D / 2);
  float *q = qkv, *k = qkv + d->heads * D, *v = k + d->kvh * D;
  for (size_t h = 0; h < d->heads; ++h) {
    rmsnorm(q + h * D, F(IN_Q_NORM), D, q + h * D);
    rope(q + h * D, c, s, D);
  }
  for (size_t h = 0; h < d->kvh; ++h) {
    rmsnorm(k + h * D, F(IN_K_NORM), D, k + h * D);
    rope(k + h * D, c, s, D);
    memcpy(pk + (h * total + pos) * D, k + h * D, D * sizeof(float));
    memcpy(pv + (h * total + pos) * D, v + h * D, D * sizeof(float));
  }
}

/* present = past + the new rows; attn [T][heads * D] (head-major) from w->qkv. */
static void attention(const LayerDims *d, const void *const *in, const Work *w, float *pk, float *pv) {
  const size_t D = d->D, P = d->P, total = P + d->T, group = d->heads / d->kvh;
  const size_t nqkv = (d->heads + 2 * d->kvh) * D;
  for (size_t h = 0; h < d->kvh && P > 0; ++h) {
    memcpy(pk + h * total * D, F(IN_PAST_K) + h * P * D, P * D * sizeof(float));
    memcpy(pv + h * total * D, F(IN_PAST_V) + h * P * D, P * D * sizeof(float));
  }
  for (size_t t = 0; t < d->T; ++t) qk_rows(d, in, w->qkv + t * nqkv, t, pk, pv);
  for (size_t t = 0; t < d->T; ++t)
    for (size_t j = 0; j < d->heads; ++j) {
      size_t kv = j / group;
      attend(w->qkv + t * nqkv + j * D, pk + kv * total * D, pv + kv * total * D, P + t + 1, D, w->scores,
             w->attn + (t * d->heads + j) * D);
    }
}

/* x2 = x + o(attention(qkv(rmsnorm(x) * input_norm))); present_k, present_v written. */
static void attention_block(const LayerDims *d, const void *const *in, const Work *w, float *const *out) {
  const size_t T = d->T, H = d->H, nqkv = (d->heads + 2 * d->kvh) * d->D;
  for (size_t t = 0; t < T; ++t) rmsnorm(F(IN_X) + t * H, F(IN_NORM1), H, w->h + t * H);
  QAct a = quantize(w, w->h, T, H);
  qtts_gemv(U8(IN_QKV_Q), F(IN_QKV_S), nqkv, &a, w->qkv, w->dot);
  attention(d, in, w, out[1], out[2]);
  a = quantize(w, w->attn, T, d->heads * d->D);
  qtts_gemv(U8(IN_O_Q), F(IN_O_S), H, &a, w->proj, w->dot);
  for (size_t i = 0; i < T * H; ++i) w->x2[i] = F(IN_X)[i] + w->proj[i];
}

/* y = x2 + down(rotate(silu(gate) * up)), gate and up from gemv(rmsnorm(x2) * post_norm). */
static void mlp_block(const LayerDims *d, const void *const *in, const Work *w, float *y) {
  const size_t T = d->T, H = d->H, I = d->I, blocks = T * (I / (d->a * d->b));
  for (size_t t = 0; t < T; ++t) rmsnorm(w->x2 + t * H, F(IN_NORM2), H, w->h + t * H);
  QAct a = quantize(w, w->h, T, H);
  qtts_gemv_glu(U8(IN_GU_Q), F(IN_GU_S), 2 * I, &a, w->gu, w->act, w->dot);
  /* ~16 units over all blocks, of 8 rows at least */
  size_t split = (16 + blocks - 1) / blocks, most = (d->a + 7) / 8;
  Rotation rot = {w->act, F(IN_HA), F(IN_HB), w->rot, d->a, d->b, split < most ? split : most};
  qtts_pool_run(rotate_unit, &rot, blocks * rot.split);
  a = quantize(w, w->rot, T, I);
  qtts_gemv(U8(IN_DOWN_Q), F(IN_DOWN_S), H, &a, w->proj, w->dot);
  for (size_t i = 0; i < T * H; ++i) y[i] = w->x2[i] + w->proj[i];
}

/* Carve the scratch (grown if needed, under g_lock) into w's buffers, each 64-byte aligned. */
static int work_init(const LayerDims *d, Work *w) {
  const size_t T = d->T, H = d->H, I = d->I, hd = d->heads * d->D, nqkv = hd + 2 * d->kvh * d->D;
  const size_t kmax = H > hd ? (H > I ? H : I) : (hd > I ? hd : I);
  void **dst[] = {(void **)&w->h, (void **)&w->qkv, (void **)&w->attn, (void **)&w->x2, (void **)&w->proj,
                  (void **)&w->gu, (void **)&w->act, (void **)&w->rot, (void **)&w->scores, (void **)&w->scale,
                  (void **)&w->q, (void **)&w->q16, (void **)&w->corr};
  const size_t bytes[] = {T * H * 4, T * nqkv * 4, T * hd * 4, T * H * 4, T * H * 4, T * 2 * I * 4, T * I * 4,
                          T * I * 4, (d->P + T) * 4, T * QSTRIDE(kmax / QBLOCK) * 4, T * kmax, T * kmax * 2,
                          T * QSTRIDE(kmax / QBLOCK) * 4};
  size_t total = 0;
  for (size_t i = 0; i < sizeof bytes / sizeof *bytes; ++i) total += (bytes[i] + 63) / 64 * 64;
  if (total > g_scratch_size) {
    void *p = NULL;
    if (posix_memalign(&p, 64, total) != 0) return -1;
    free(g_scratch);
    g_scratch = p, g_scratch_size = total;
  }
  char *p = g_scratch;
  for (size_t i = 0; i < sizeof bytes / sizeof *bytes; ++i) *dst[i] = p, p += (bytes[i] + 63) / 64 * 64;
  return 0;
}

int qtts_layer_run(const LayerDims *d, const void *const *in, float *const *out, DotFn dot) {
  Work w;
  pthread_mutex_lock(&g_lock);
  int rc = work_init(d, &w);
  if (rc == 0) {
    w.dot = dot;
    attention_block(d, in, &w, out);
    mlp_block(d, in, &w, out[0]);
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* One MatMulNBits (bits 8, block 128, no zero points) on T = 1 or 2 rows x [T][K]: out [T][N],
 * on the layer's threads (tests and benchmarks). isa as qtts_decoder_layer. 0; -1: that path is
 * unavailable; -2: bad sizes; -3: out of memory. */
int qtts_gemv_q8(const float *x, size_t T, size_t K, const uint8_t *q, const float *s, size_t N, float *out,
                 const char *isa) {
  const char *name;
  Work w = {0};
  w.dot = qtts_dot_pick(isa, &name);
  if (!w.dot) return -1;
  if (T < 1 || T > LAYER_MAX_T || K == 0 || K % QBLOCK || K / QBLOCK > LAYER_MAX_BLOCKS || N == 0) return -2;
  w.q = malloc(T * K), w.q16 = malloc(T * K * 2);
  w.scale = malloc(T * QSTRIDE(K / QBLOCK) * 4), w.corr = malloc(T * QSTRIDE(K / QBLOCK) * 4);
  int rc = w.q && w.q16 && w.scale && w.corr ? 0 : -3;
  if (rc == 0) {
    pthread_mutex_lock(&g_lock);
    QAct a = quantize(&w, x, T, K);
    qtts_gemv(q, s, N, &a, out, w.dot);
    pthread_mutex_unlock(&g_lock);
  }
  free(w.q), free(w.q16), free(w.scale), free(w.corr);
  return rc;
}
