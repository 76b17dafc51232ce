"""The check a freshly compiled kernel library passes before it is used (run in a child process).

``python selftest.py LIB``: registers ``LIB`` with onnxruntime, runs one ``qtts.kernels::SnakeBeta``
node on a tensor large enough to be split over threads (and with some values past the range
reduction's limit), and compares it with a float64 numpy reference; then one small
``qtts.kernels::DecoderLayer`` node (T = 2 after 3 cached positions) against its float64 reference
(:func:`layer_reference`, also the tests' reference). Exit 0 and ``ok <isa>`` on
stdout when it is >= :data:`MIN_SNR_DB`; anything else (a wrong ABI slot crashes the child, not
the caller) means the library is not used. Standalone on purpose: numpy and onnxruntime only
(no ``onnx`` package: the one-node model is written as protobuf bytes here).
"""

from __future__ import annotations

import ctypes
import sys

MIN_SNR_DB = 100.0
SHAPE = (2, 3, 20000)  # 120k values: several 16k blocks, so the intra-op ParallelFor runs


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    """One protobuf field: an int (varint) or bytes / str (length-delimited)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _tensor_info(name: str, dims: tuple, elem_type: int = 1) -> bytes:
    shape = b"".join(_field(1, _field(1, d)) for d in dims)  # TensorShapeProto.dim.dim_value
    tensor = _field(1, elem_type) + _field(2, shape)  # elem_type (1 FLOAT, 2 UINT8, 6 INT32), shape
    return _field(1, name) + _field(2, _field(1, tensor))  # ValueInfoProto: name, type.tensor_type


def snake_model(dims: tuple, coeff: tuple | None = None) -> bytes:
    """ModelProto bytes: y = qtts.kernels::SnakeBeta(x, a, inv_b), a and inv_b shaped ``coeff``
    (default [1, C, 1])."""
    coeff = coeff or (1, dims[-2], 1)
    node = b"".join(_field(1, i) for i in ("x", "a", "b")) + _field(2, "y") + _field(4, "SnakeBeta")
    node += _field(7, "qtts.kernels")
    graph = _field(1, node) + _field(2, "selftest")
    graph += _field(11, _tensor_info("x", dims)) + _field(11, _tensor_info("a", coeff))
    graph += _field(11, _tensor_info("b", coeff)) + _field(12, _tensor_info("y", dims))
    opsets = _field(8, _field(1, "") + _field(2, 17)) + _field(8, _field(1, "qtts.kernels") + _field(2, 1))
    return _field(1, 8) + _field(7, graph) + opsets  # ir_version 8


def inputs(dims: tuple, seed: int = 0):
    """x ~ N(0, 9) with every 997th value scaled past the range reduction's limit; a, inv_b [1, C, 1]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(dims) * 3).astype(np.float32)
    x.reshape(-1)[::997] *= 20000.0
    a = np.exp(rng.standard_normal((1, dims[-2], 1)) * 0.5).astype(np.float32)
    b = (1.0 / (np.exp(rng.standard_normal((1, dims[-2], 1)) * 0.5) + 1e-9)).astype(np.float32)
    return x, a, b


def reference(x, a, b):
    """float64 SnakeBeta of the float32 product a * x (what torch and the graph feed to sin)."""
    import numpy as np

    v = (x * a).astype(np.float64)
    return x.astype(np.float64) + b.astype(np.float64) * np.sin(v) ** 2


def snr_db(ref, got) -> float:
    import numpy as np

    err = float(((np.asarray(got, dtype=np.float64) - ref) ** 2).sum())
    return float("inf") if err == 0 else 10.0 * float(np.log10(float((ref**2).sum()) / err))


def check(x, got, ref) -> str | None:
    """None when ``got`` is faithful: >= MIN_SNR_DB on the ordinary values, and the large ones
    (libm's sinf) within two float32 steps of the reference; else what is wrong."""
    import numpy as np

    big = np.abs(x) > 1000.0
    snr = snr_db(ref[~big], got[~big])
    off = np.abs(got[big] - ref[big]) > 2 * np.spacing(np.abs(ref[big]).astype(np.float32))
    if got.shape != x.shape or not snr >= MIN_SNR_DB or off.any():
        return f"{snr:.1f} dB against float64 (>= {MIN_SNR_DB} needed), {int(off.sum())} large values off"
    return None


# ----------------------------------------------------------------------------- DecoderLayer
#: the op's inputs in order with their ONNX element types (1 float, 2 uint8, 6 int32)
LAYER_INPUTS = (
    ("x", 1), ("past_k", 1), ("past_v", 1), ("seqlens_k", 6), ("total_len", 6), ("cos", 1), ("sin", 1),
    ("input_norm", 1), ("qkv_q", 2), ("qkv_s", 1), ("q_norm", 1), ("k_norm", 1), ("o_q", 2), ("o_s", 1),
    ("post_norm", 1), ("gu_q", 2), ("gu_s", 1), ("ha", 1), ("hb", 1), ("down_q", 2), ("down_s", 1),
)  # fmt: skip
LAYER_OUTPUTS = ("y", "present_k", "present_v")
#: max |kernel - float64 reference| / max |reference| of a layer: float32 rounding (~1e-7), plus an
#: activation code that may flip by one where a value sits within rounding of a half step (rare; a
#: few 1e-4 each, as one code of the last GEMV's input moves every output)
LAYER_TOL = 1e-3
EPS = 1e-6


def layer_model(shapes: list) -> bytes:
    """ModelProto bytes: one qtts.kernels::DecoderLayer node, inputs shaped ``shapes`` (21 tuples)."""
    t, h = shapes[0][1:]
    kvh, p, d = shapes[1][1:]
    node = b"".join(_field(1, name) for name, _ in LAYER_INPUTS) + b"".join(_field(2, n) for n in LAYER_OUTPUTS)
    graph = _field(1, node + _field(4, "DecoderLayer") + _field(7, "qtts.kernels")) + _field(2, "selftest")
    graph += b"".join(_field(11, _tensor_info(n, dims, e)) for (n, e), dims in zip(LAYER_INPUTS, shapes))
    outs = ((1, t, h), (1, kvh, p + t, d), (1, kvh, p + t, d))
    graph += b"".join(_field(12, _tensor_info(n, dims)) for n, dims in zip(LAYER_OUTPUTS, outs))
    opsets = _field(8, _field(1, "") + _field(2, 17)) + _field(8, _field(1, "qtts.kernels") + _field(2, 1))
    return _field(1, 8) + _field(7, graph) + opsets


def _sylvester(n: int):
    import numpy as np

    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def layer_inputs(t=1, p=0, h=256, heads=4, kvh=2, d=64, i=512, a=16, b=8, seed=0) -> list:
    """The op's 21 inputs for random weights (codes 0..255, scales that keep activations O(1)), RoPE
    tables with theta 10000, Sylvester-Hadamard factors (a, b powers of two)."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def f(*shape, scale=1.0, shift=0.0):
        return (rng.standard_normal(shape) * scale + shift).astype(np.float32)

    def weight(n, k):
        q = rng.integers(0, 256, (n, k // 128, 128), dtype=np.uint8)
        return q, ((np.abs(f(n, k // 128)) + 0.5) / (74.0 * np.sqrt(k))).astype(np.float32)

    angle = np.arange(p + t + 3)[:, None] / 10000.0 ** (np.arange(d // 2) * 2.0 / d)
    rope = [np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)]
    total = [np.array([p + t - 1], np.int32), np.array(p + t, np.int32)]
    return [f(1, t, h), f(1, kvh, p, d), f(1, kvh, p, d), *total, *rope, f(h, scale=0.1, shift=1.0),
            *weight((heads + 2 * kvh) * d, h), f(d, scale=0.1, shift=1.0), f(d, scale=0.1, shift=1.0),
            *weight(h, heads * d), f(h, scale=0.1, shift=1.0), *weight(2 * i, h), _sylvester(a), _sylvester(b),
            *weight(h, i)]  # fmt: skip


def quantize_act(v):
    """MatMulNBits' activation quantization of v [T, K] in float32, as MLAS does it: (codes
    [T, K/128, 128], scales [T, K/128, 1]) with codes rint(v * (127 / amax)), scales amax / 127."""
    import numpy as np

    v = np.asarray(v, dtype=np.float32).reshape(len(v), -1, 128)
    amax = np.abs(v).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return np.clip(np.rint(v * inv), -127, 127), (amax / np.float32(127)).astype(np.float32)


def gemv_reference(v, q, s, quantized: bool = True):
    """MatMulNBits (bits 8, block 128, zero point 128, int8 activations) of v [T, K], in float64;
    ``quantized=False``: v itself (float64) times the dequantized weight, for comparisons with an
    fp32 model."""
    import numpy as np

    if not quantized:
        w = (q.astype(np.float64) - 128.0) * s.reshape(q.shape[:2]).astype(np.float64)[..., None]
        return np.asarray(v, dtype=np.float64) @ w.reshape(len(q), -1).T
    codes, sa = quantize_act(v)
    dots = np.einsum("tbk,nbk->tnb", codes.astype(np.float64), q.astype(np.float64) - 128.0)
    return (dots * s.reshape(q.shape[:2]).astype(np.float64)[None] * sa[:, None, :, 0]).sum(-1)


def _attention(q, k, v, p: int):
    """q [T, heads, D], k / v [kvh, P + T, D]; row t sees positions 0 .. p + t."""
    import numpy as np

    t, heads, d = q.shape
    out, group = np.zeros_like(q), heads // k.shape[0]
    for r in range(t):
        for j in range(heads):
            score = k[j // group, : p + r + 1] @ q[r, j] / np.sqrt(d)
            w = np.exp(score - score.max())
            out[r, j] = (w / w.sum()) @ v[j // group, : p + r + 1]
    return out.reshape(t, -1)


def layer_reference(inputs, quantized: bool = True):
    """(y, present_k, present_v) of the DecoderLayer in float64 (activations quantized in float32
    as MatMulNBits does, unless ``quantized`` is False)."""
    import functools

    import numpy as np

    x, pk, pv, _, _, cos, sin, n1, qkv_q, qkv_s, qn, kn, o_q, o_s, n2, gu_q, gu_s, ha, hb, dq, ds = (
        a.astype(np.float64) if a.dtype == np.float32 else a for a in inputs)  # fmt: skip
    (t, _), (kvh, p, d) = x.shape[1:], pk.shape[1:]
    heads, i, half = qkv_q.shape[0] // d - 2 * kvh, gu_q.shape[0] // 2, d // 2
    gemv = functools.partial(gemv_reference, quantized=quantized)

    def rms(u, w):
        return u / np.sqrt((u * u).mean(-1, keepdims=True) + EPS) * w

    def rope(u, c=cos[p : p + t, None], s=sin[p : p + t, None]):
        return np.concatenate([u[..., :half] * c - u[..., half:] * s, u[..., half:] * c + u[..., :half] * s], -1)

    qkv = gemv(rms(x[0], n1), qkv_q, qkv_s)
    q = rope(rms(qkv[:, : heads * d].reshape(t, heads, d), qn))
    k = rope(rms(qkv[:, heads * d : (heads + kvh) * d].reshape(t, kvh, d), kn))
    keys = np.concatenate([pk[0], k.transpose(1, 0, 2)], 1)
    values = np.concatenate([pv[0], qkv[:, (heads + kvh) * d :].reshape(t, kvh, d).transpose(1, 0, 2)], 1)
    x2 = x[0] + gemv(_attention(q, keys, values, p), o_q, o_s)
    gu = gemv(rms(x2, n2), gu_q, gu_s)
    act = gu[:, :i] / (1.0 + np.exp(-gu[:, :i])) * gu[:, i:]
    act = (ha @ act.reshape(t, -1, ha.shape[0], hb.shape[0]) @ hb).reshape(t, i)
    return (x2 + gemv(act, dq, ds))[None], keys[None], values[None]


def layer_error(got, ref) -> float:
    """The largest of max |got - ref| / max |ref| over the three outputs."""
    import numpy as np

    return max(float(np.abs(np.asarray(g, np.float64) - r).max() / np.abs(r).max()) for g, r in zip(got, ref))


def _check_layer(so) -> tuple[str, float]:
    """One DecoderLayer node (T = 2 after 3 positions) against float64: ('', err) or (problem, err)."""
    import onnxruntime as ort

    inputs = layer_inputs(t=2, p=3, seed=1)
    session = ort.InferenceSession(layer_model([a.shape for a in inputs]), so, providers=["CPUExecutionProvider"])
    got = session.run(None, {name: a for (name, _), a in zip(LAYER_INPUTS, inputs)})
    err = layer_error(got, layer_reference(inputs))
    return ("" if err <= LAYER_TOL else f"DecoderLayer off by {err:.2e} (<= {LAYER_TOL} needed)"), err


def main(argv: list[str]) -> int:
    import onnxruntime as ort

    lib = argv[0]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(lib)
    session = ort.InferenceSession(snake_model(SHAPE), so, providers=["CPUExecutionProvider"])
    x, a, b = inputs(SHAPE)
    got = session.run(None, {"x": x, "a": a, "b": b})[0]
    ref = reference(x, a, b)
    problem = check(x, got, ref)
    if problem:
        print(f"qtts.kernels SnakeBeta: {problem}", file=sys.stderr)
        return 1
    layer_problem, layer_err = _check_layer(so)
    if layer_problem:
        print(f"qtts.kernels {layer_problem}", file=sys.stderr)
        return 1
    isa, layer_isa = ctypes.CDLL(lib).qtts_kernels_isa, ctypes.CDLL(lib).qtts_layer_isa
    isa.restype = layer_isa.restype = ctypes.c_char_p
    big = abs(x) > 1000.0
    snr = snr_db(ref[~big], got[~big])
    print(f"ok {isa().decode()} {snr:.1f} dB; DecoderLayer {layer_isa().decode()} {layer_err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
