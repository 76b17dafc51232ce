"""ctypes access to the library's ``qtts.kernels::DecoderLayer`` (``layer*.c``): the op on numpy
arrays without onnxruntime (tests, benchmarks), its int8 GEMV alone, its thread count and code path.

The op itself runs inside onnxruntime once :func:`qtts.kernels.register` has added the library to
a session; everything here takes the library's ``path`` (:func:`qtts.kernels.library`).
:data:`INPUTS` lists the op's 21 inputs in order with their element types; ``layer_op.c``'s
header comment has the shapes.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from .selftest import LAYER_INPUTS

#: the op's inputs in order, with their dtypes (seqlens_k and total_len are ignored by the kernel:
#: the graph's fallback body reads them; pass None here)
INPUTS = tuple((name, {1: np.float32, 2: np.uint8, 6: np.int32}[t]) for name, t in LAYER_INPUTS)
#: the sizes qtts_decoder_layer_dims derives, in its order
DIMS = ("T", "H", "P", "kvh", "D", "heads", "I", "a", "b", "L")
_ERR = 512


@functools.cache
def _lib(path: str):
    lib = ctypes.CDLL(path)
    p, size, cstr = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    lib.qtts_decoder_layer_dims.argtypes = [p, p, p, size]
    lib.qtts_decoder_layer.argtypes = [p, p, p, cstr, p, size]
    lib.qtts_gemv_q8.argtypes = [p, size, size, p, p, size, p, cstr]
    lib.qtts_layer_threads.argtypes = lib.qtts_layer_spin_us.argtypes = [ctypes.c_int]
    lib.qtts_layer_isa.restype = cstr
    for name in ("qtts_decoder_layer_dims", "qtts_decoder_layer", "qtts_gemv_q8", "qtts_layer_threads", "qtts_layer_spin_us"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def set_threads(path: str, n: int) -> int:
    """The op's threads in this process (the calling thread included; 1: no workers); n <= 0 only
    asks. Returns the count in force."""
    return int(_lib(path).qtts_layer_threads(int(n)))


def set_spin_us(path: str, us: int) -> int:
    """How long (us) the op's idle threads spin before they block, capped at 1 s; us < 0 only asks.
    Returns the bound in force."""
    return int(_lib(path).qtts_layer_spin_us(int(us)))


def isa(path: str) -> str:
    """The op's int8 path on this CPU: avx512 (VNNI), avx2 or generic (``QTTS_KERNELS_ISA`` forces one)."""
    return _lib(path).qtts_layer_isa().decode()


def _shapes(arrays: list) -> np.ndarray:
    """[21, 5] int64: rank then up to 4 dims per input, as the C side reads them."""
    shapes = np.zeros((len(INPUTS), 5), dtype=np.int64)
    for i, ((name, dtype), a) in enumerate(zip(INPUTS, arrays)):
        if a is None:
            continue
        if a.dtype != dtype or (a.ndim > 4 and i not in (3, 4)):
            raise ValueError(f"DecoderLayer input {i} ({name}) must be a {np.dtype(dtype).name} array of rank <= 4, "
                             f"got {a.dtype} {a.shape}")  # fmt: skip
        if a.ndim <= 4:
            shapes[i, : a.ndim + 1] = (a.ndim, *a.shape)
    return shapes


def dims(path: str, inputs) -> dict:
    """The sizes the op derives from ``inputs`` (:data:`DIMS`); ValueError naming a bad input."""
    arrays = [None if a is None else np.asarray(a) for a in inputs]
    if len(arrays) != len(INPUTS):
        raise ValueError(f"DecoderLayer takes {len(INPUTS)} inputs, got {len(arrays)}")
    out, err = np.zeros(len(DIMS), dtype=np.int64), ctypes.create_string_buffer(_ERR)
    if _lib(path).qtts_decoder_layer_dims(_shapes(arrays).ctypes.data, out.ctypes.data, err, _ERR) != 0:
        raise ValueError(err.value.decode())
    return dict(zip(DIMS, (int(v) for v in out)))


def decoder_layer(path: str, inputs, isa: str | None = None):
    """(y [1, T, H], present_k, present_v [1, kvh, P + T, D]) of the op on numpy ``inputs`` (21, in
    :data:`INPUTS` order; 3 and 4 may be None), float32. ``isa``: None for the library's path, or
    "avx512" | "avx2" | "generic"; None is returned when this CPU lacks that one. ValueError on
    inputs the op would refuse."""
    arrays = [None if a is None else np.ascontiguousarray(a) for a in inputs]
    d = dims(path, arrays)
    y = np.empty((1, d["T"], d["H"]), dtype=np.float32)
    present = [np.empty((1, d["kvh"], d["P"] + d["T"], d["D"]), dtype=np.float32) for _ in range(2)]
    ins = (ctypes.c_void_p * len(arrays))(*(None if a is None else a.ctypes.data for a in arrays))
    outs = (ctypes.c_void_p * 3)(y.ctypes.data, present[0].ctypes.data, present[1].ctypes.data)
    err = ctypes.create_string_buffer(_ERR)
    shapes = _shapes(arrays)
    rc = _lib(path).qtts_decoder_layer(shapes.ctypes.data, ins, outs, isa.encode() if isa else None, err, _ERR)
    if rc == -1:
        return None
    if rc != 0:
        raise ValueError(err.value.decode())
    return y, present[0], present[1]


def gemv_q8(path: str, x: np.ndarray, q: np.ndarray, s: np.ndarray, isa: str | None = None):
    """MatMulNBits (bits 8, block 128, no zero points, accuracy_level 4) of x [T, K] (T 1 or 2)
    with q [N, K/128, 128] uint8, s [N, K/128] float32 -> [T, N], on the op's threads; None when
    this CPU lacks ``isa``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    q, s = np.ascontiguousarray(q, dtype=np.uint8), np.ascontiguousarray(s, dtype=np.float32)
    (t, k), n = x.shape, q.shape[0]
    if q.shape != (n, k // 128, 128) or s.size != n * (k // 128):
        raise ValueError(f"gemv_q8: q must be [N, {k // 128}, 128] and s [N, {k // 128}], got {q.shape}, {s.shape}")
    out = np.empty((t, n), dtype=np.float32)
    rc = _lib(path).qtts_gemv_q8(x.ctypes.data, t, k, q.ctypes.data, s.ctypes.data, n, out.ctypes.data,
                                 isa.encode() if isa else None)  # fmt: skip
    if rc == -1:
        return None
    if rc != 0:
        raise ValueError(f"gemv_q8: T must be 1 or 2 and K a multiple of 128 (<= 131072), got x {x.shape}")
    return out
