"""The check a freshly compiled kernel library passes before it is used (run in a child process).

``python selftest.py LIB``: registers ``LIB`` with onnxruntime, runs one ``qtts.kernels::SnakeBeta``
node on a tensor large enough to be split over threads (and with some values past the range
reduction's limit), and compares it with a float64 numpy reference. Exit 0 and ``ok <isa>`` on
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


def _tensor_info(name: str, dims: tuple) -> bytes:
    shape = b"".join(_field(1, _field(1, d)) for d in dims)  # TensorShapeProto.dim.dim_value
    tensor = _field(1, 1) + _field(2, shape)  # elem_type FLOAT, shape
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
    isa = ctypes.CDLL(lib).qtts_kernels_isa
    isa.restype = ctypes.c_char_p
    big = abs(x) > 1000.0
    print(f"ok {isa().decode()} {snr_db(ref[~big], got[~big]):.1f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
