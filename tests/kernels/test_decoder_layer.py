"""qtts.kernels::DecoderLayer (layer*.c): every int8 code path gives the same bits as the plain C
one, the kernel against a float64 reference (selftest.layer_reference) and its GEMV against
onnxruntime's MatMulNBits, the op through onnxruntime equal to the ctypes call, one / two / three
threads and concurrent callers equal, and shapes the op refuses with a message naming the input.

Like test_kernel_library.py, these fail (never skip) when the library cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from qtts import kernels
from qtts.kernels import layer, selftest
from support.kernel_fixtures import kernel_fixtures

lib, _kernels_on = kernel_fixtures()

#: (T, P): a step and the first pass, with and without cached positions
CASES = [(1, 0), (1, 5), (2, 0), (2, 3)]
#: the default small shapes (H 256, heads 4, kvh 2, D 64, I 512 = 4 x 16 x 8), and odd ones: 3 blocks
#: per row (a 16-chunk step wraps mid-row), 6 heads over 3 kv heads, I = 24 x 4 x 8
SHAPES = {"small": {}, "odd": dict(h=384, heads=6, kvh=3, d=64, i=768, a=4, b=8)}


@pytest.fixture
def threads(lib):
    """Set the op's threads for one test; the count before is restored after it."""
    before = layer.set_threads(lib, 0)
    yield lambda n: layer.set_threads(lib, n)
    layer.set_threads(lib, before)


def _layer_isas() -> list[str]:
    """The DecoderLayer paths this CPU has: avx512 needs AVX-512 F + BW + VNNI, avx2 AVX2."""
    found = ["generic"]
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64":
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = set(next(line for line in fh if line.startswith("flags")).split())
        found += [isa for isa, need in (("avx2", {"avx2"}), ("avx512", {"avx512f", "avx512bw", "avx512_vnni"}))
                  if need <= flags]  # fmt: skip
    return found


def _inputs(t: int, p: int, shape: str, seed: int = 0) -> list:
    return selftest.layer_inputs(t=t, p=p, seed=seed + 10 * t + p, **SHAPES[shape])


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t, p", CASES)
def test_every_path_gives_the_bits_of_the_plain_one(lib, t, p, shape):
    inputs = _inputs(t, p, shape)
    plain = layer.decoder_layer(lib, inputs, "generic")
    for isa in ("avx2", "avx512", "neon", "sse9"):
        got = layer.decoder_layer(lib, inputs, isa)
        if isa not in _layer_isas():
            assert got is None  # refused, never run on a CPU without it
            continue
        assert _equal(got, plain), f"the {isa} path differs from the plain C one"
    assert layer.isa(lib) == _layer_isas()[-1]


@pytest.mark.parametrize("forced", ["generic", "avx2", "neon"])
def test_qtts_kernels_isa_picks_the_layer_path_at_load(lib, forced):
    code = f"from qtts.kernels import layer; print(layer.isa({lib!r}))"
    env = {**os.environ, "QTTS_KERNELS_ISA": forced}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert out.stdout.strip() == (forced if forced in _layer_isas() else _layer_isas()[-1])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t, p", CASES)
def test_the_layer_matches_float64(lib, t, p, shape):
    """Float rounding only (~1e-7 here): the reference quantizes activations as the kernel does.
    The bound (selftest.LAYER_TOL, 1e-3 of the output scale) also admits a code that flips by one
    where a value sits within rounding of a half step (a few 1e-4 each; not seen on these seeds)."""
    inputs = _inputs(t, p, shape)
    got, ref = layer.decoder_layer(lib, inputs), selftest.layer_reference(inputs)
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert selftest.layer_error(got, ref) <= selftest.LAYER_TOL
    for present, past in ((got[1], inputs[1]), (got[2], inputs[2])):
        assert np.array_equal(present[:, :, :p], past)  # the cache rows are copied, not recomputed


@pytest.mark.parametrize("t, k, n", [(1, 256, 384), (2, 1024, 512), (1, 3072, 256), (1, 384, 40), (2, 384, 40)])
def test_the_gemv_is_matmulnbits(lib, t, k, n):
    """The same float32 input quantizes to the same codes here, in the reference and in
    onnxruntime (accuracy_level 4), so only the float sums' order differs: ~1e-7. N = 40: rows
    that end mid-step (the vector paths' tails)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(k + n)
    x = rng.standard_normal((t, k)).astype(np.float32)
    q = rng.integers(0, 256, (n, k // 128, 128), dtype=np.uint8)
    s = ((rng.random((n, k // 128)) + 0.5) / (74 * np.sqrt(k))).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["x", "q", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=8,
                            block_size=128, accuracy_level=4)  # fmt: skip
    x_info, y_info = (helper.make_tensor_value_info(v, TensorProto.FLOAT, [t, m]) for v, m in (("x", k), ("y", n)))
    weights = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")]
    graph = helper.make_graph([node], "g", [x_info], [y_info], initializer=weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = selftest.gemv_reference(x, q, s)
    scale = np.abs(ref).max()
    outs = {isa: layer.gemv_q8(lib, x, q, s, isa) for isa in _layer_isas()}
    assert all(np.array_equal(outs["generic"], o) for o in outs.values())
    assert np.abs(outs["generic"] - ref).max() <= 1e-6 * scale
    assert np.abs(session.run(None, {"x": x})[0] - ref).max() <= 2e-6 * scale  # what the fallback body runs


def _torch_layer(inputs):
    """qtts.model.layers.DecoderLayer run on ``inputs`` (the op's 21) with the dequantized weights,
    the rotation folded into down_proj: (y, present_k, present_v)."""
    from types import SimpleNamespace

    import torch

    from qtts.export.quantize import dequantize
    from qtts.model.layers import DecoderLayer, causal_mask

    x, pk, pv, _, _, cos, sin, n1, qkv_q, qkv_s, qn, kn, o_q, o_s, n2, gu_q, gu_s, ha, hb, dq, ds = inputs
    (t, h), (kvh, p, d), i = x.shape[1:], pk.shape[1:], len(gu_q) // 2
    heads = len(qkv_q) // d - 2 * kvh
    cfg = SimpleNamespace(hidden_size=h, intermediate_size=i, num_attention_heads=heads, num_key_value_heads=kvh,
                          head_dim=d, rms_norm_eps=1e-6)  # fmt: skip
    qkv, gu = dequantize(qkv_q, qkv_s, 8, h).T, dequantize(gu_q, gu_s, 8, h).T  # [out, in]
    rot = (ha.astype(np.float64) @ np.eye(i).reshape(i, -1, len(ha), len(hb)) @ hb).reshape(i, i)  # row j: e_j
    weights = {
        "self_attn.q_proj": qkv[: heads * d],
        "self_attn.k_proj": qkv[heads * d : (heads + kvh) * d],
        "self_attn.v_proj": qkv[(heads + kvh) * d :],
        "self_attn.o_proj": dequantize(o_q, o_s, 8, heads * d).T,
        "mlp.gate_proj": gu[:i],
        "mlp.up_proj": gu[i:],
        "mlp.down_proj": dequantize(dq, ds, 8, i).T @ rot.T,  # down(rotate(act)) = down (act @ rot)
        "self_attn.q_norm": qn,
        "self_attn.k_norm": kn,
        "input_layernorm": n1,
        "post_attention_layernorm": n2,
    }
    model = DecoderLayer(cfg)
    with torch.no_grad():
        for name, value in weights.items():
            model.get_submodule(name).weight.copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))
        kv = torch.zeros(2, 1, kvh, p + t, d)
        kv[0, :, :, :p], kv[1, :, :, :p] = torch.from_numpy(pk), torch.from_numpy(pv)
        c, s = (torch.from_numpy(np.concatenate([v, v], -1)[p : p + t]) for v in (cos, sin))  # [T, D] tables
        y = model(torch.from_numpy(x), c, s, kv, p, causal_mask(p, t))
    return y.numpy(), kv[0].numpy(), kv[1].numpy()


@pytest.mark.parametrize("t, p", [(1, 4), (2, 3)])
def test_the_layer_is_the_models_decoder_layer(lib, t, p):
    """The reference without int8 activations is qtts.model.layers.DecoderLayer (fp32 rounding), and
    the kernel is that layer but for the int8 activations (a few 1e-3 of the layer's update)."""
    inputs = selftest.layer_inputs(t=t, p=p)
    model = _torch_layer(inputs)
    assert selftest.layer_error(model, selftest.layer_reference(inputs, quantized=False)) <= 1e-5
    got, x = layer.decoder_layer(lib, inputs), inputs[0]
    assert np.abs(got[0] - model[0]).max() <= 5e-2 * np.abs(model[0] - x).max()
    for g, m in zip(got[1:], model[1:]):
        assert np.abs(g - m).max() <= 5e-2 * np.abs(m).max()


def _feeds(inputs) -> dict:
    return {name: a for (name, _), a in zip(selftest.LAYER_INPUTS, inputs)}


def _session(lib_path: str, model: bytes, intra_threads: int = 1):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_threads
    so.register_custom_ops_library(lib_path)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("t, p", CASES)
def test_the_onnxruntime_op_is_the_ctypes_call(lib, t, p):
    inputs = _inputs(t, p, "odd")
    got = _session(lib, selftest.layer_model([a.shape for a in inputs])).run(None, _feeds(inputs))
    assert _equal(got, layer.decoder_layer(lib, inputs))


def test_one_session_takes_every_cache_length(lib):
    """Symbolic T and P, as the predictor graph has them: one session, the first pass and steps."""
    from onnx import helper

    def info(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    dims = {"x": [1, "T", 256], "past_k": [1, 2, "P", 64], "past_v": [1, 2, "P", 64], "seqlens_k": [1],
            "total_len": [], "cos": ["L", 32], "sin": ["L", 32]}  # fmt: skip
    shapes = [a.shape for a in selftest.layer_inputs()]
    ins = [info(n, e, dims.get(n, list(s))) for (n, e), s in zip(selftest.LAYER_INPUTS, shapes)]
    outs = [info("y", 1, [1, "T", 256]), *(info(n, 1, [1, 2, "S", 64]) for n in ("present_k", "present_v"))]
    node = helper.make_node("DecoderLayer", [n for n, _ in selftest.LAYER_INPUTS], list(selftest.LAYER_OUTPUTS),
                            domain="qtts.kernels")  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("qtts.kernels", 1)]
    model = helper.make_model(helper.make_graph([node], "layer", ins, outs), opset_imports=opsets)
    session = _session(lib, model.SerializeToString(), intra_threads=2)
    for t, p in [(2, 0), (1, 2), (1, 7)]:
        inputs = selftest.layer_inputs(t=t, p=p, seed=p)
        assert _equal(session.run(None, _feeds(inputs)), layer.decoder_layer(lib, inputs))


@pytest.mark.parametrize("t, p", [(1, 4), (2, 0)])
def test_one_two_and_three_threads_give_the_same_bits(lib, threads, t, p):
    inputs = _inputs(t, p, "odd")
    outs = []
    for n in (1, 2, 3):
        assert threads(n) == n
        outs.append(layer.decoder_layer(lib, inputs))
    assert _equal(outs[0], outs[1]) and _equal(outs[0], outs[2])


def test_concurrent_callers_wait_their_turn(lib, threads):
    """Two Python threads (ctypes drops the GIL, so the calls overlap) on the one pool: no deadlock,
    and every result is the one a lone call gives."""
    threads(2)
    cases = [_inputs(1, 2, "small", seed=s) for s in range(2)]
    expected = [layer.decoder_layer(lib, inputs) for inputs in cases]
    wrong = []

    def worker(k):
        for _ in range(20):
            if not _equal(layer.decoder_layer(lib, cases[k]), expected[k]):
                wrong.append(k)

    runners = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for r in runners:
        r.start()
    for r in runners:
        r.join(timeout=120)
    assert not any(r.is_alive() for r in runners) and not wrong


def test_set_layer_threads(lib, threads, monkeypatch):
    assert kernels.set_layer_threads(1) == 1
    assert kernels.set_layer_threads(0) == 1  # 0 only asks
    assert kernels.set_layer_threads(99) == 16  # capped
    import ctypes

    from qtts.errors import InputError

    monkeypatch.setenv(kernels.LAYER_SPIN_ENV, "7")
    kernels.set_layer_threads(2)
    assert ctypes.CDLL(lib).qtts_layer_spin_us(-1) == 7  # -1 only asks
    monkeypatch.setenv(kernels.LAYER_SPIN_ENV, "soon")
    with pytest.raises(InputError, match="QTTS_LAYER_SPIN_US='soon'"):
        kernels.set_layer_threads(2)
    monkeypatch.delenv(kernels.LAYER_SPIN_ENV)
    kernels.set_layer_threads(2)
    assert ctypes.CDLL(lib).qtts_layer_spin_us(-1) == kernels.LAYER_SPIN_DEFAULT_US
    monkeypatch.setenv(kernels.ENV, "0")
    assert kernels.set_layer_threads(2) is None


def _refusals() -> list:
    """(inputs, the index of the input the message must name) for shapes the op refuses."""
    good = selftest.layer_inputs(t=1, p=2)  # H 256, kvh 2, D 64, I 512 = 4 x 16 x 8

    def bad(i: int, value) -> tuple:
        return [value if j == i else a for j, a in enumerate(good)], i

    zeros = np.zeros
    return [
        bad(0, zeros((1, 3, 256), np.float32)),  # T = 3
        bad(0, zeros((1, 1, 200), np.float32)),  # H not a multiple of 128
        bad(2, zeros((1, 2, 3, 64), np.float32)),  # past_v longer than past_k
        bad(5, good[5][:2]),  # cos rows < P + T
        bad(8, good[8][:, :1]),  # qkv_q with one block per row
        bad(9, good[9][:-1]),  # qkv_s one row short
        bad(10, zeros(63, np.float32)),  # an odd head size
        bad(15, good[15][:-1]),  # gate_up with an odd number of rows
        bad(18, np.eye(3, dtype=np.float32)),  # a b = 48 does not divide I
        bad(20, good[20][:, :2]),  # down_s with 2 of 4 blocks
    ]


@pytest.mark.parametrize("case", range(10))
def test_refused_shapes_name_the_input(lib, case):
    import onnxruntime as ort

    inputs, index = _refusals()[case]
    name = selftest.LAYER_INPUTS[index][0]
    with pytest.raises(ValueError, match=rf"input {index} \({name}\)"):
        layer.decoder_layer(lib, inputs)
    session = _session(lib, selftest.layer_model([a.shape for a in inputs]))
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=rf"input {index} \({name}\)"):
        session.run(None, _feeds(inputs))


def test_idle_workers_sleep(lib, threads):
    """After a call the worker spins ~50 us, then blocks: an idle process uses no CPU."""
    import time

    threads(2)
    layer.decoder_layer(lib, _inputs(1, 2, "small"))
    time.sleep(0.05)
    start = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - start < 0.1  # a spinning worker would use ~0.5 s


def test_workers_survive_onnxruntime_unloading_the_library(lib):
    """onnxruntime unloads a custom-op library with the last session options that registered it;
    the library pins itself when it starts workers, so they keep their code (a child process, as
    the failure is a crash)."""
    code = f"""if True:
        import gc, time, onnxruntime as ort
        from qtts.kernels import layer, selftest
        inputs = selftest.layer_inputs(t=1, p=2)
        so = ort.SessionOptions()
        so.register_custom_ops_library({lib!r})
        s = ort.InferenceSession(selftest.layer_model([a.shape for a in inputs]), so)
        s.run(None, {{n: a for (n, _), a in zip(selftest.LAYER_INPUTS, inputs)}})
        del s, so
        gc.collect()
        assert any({lib!r} in line for line in open("/proc/self/maps")), "unmapped"
        time.sleep(0.2)
        layer.decoder_layer({lib!r}, inputs)
        print("ok")
    """
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("spin_us", [0, 50])
def test_back_to_back_jobs_of_different_sizes_never_mix(lib, threads, spin_us):
    """Jobs of 4 and 16 units, one after another, on three threads, spinning or blocking between
    them: every result is the one-thread result, and nothing hangs or crashes. (A stress check: the
    window publish() closes, a worker reading the old ticket then the new job's size, is a few
    nanoseconds wide, so this rarely meets it; layer_pool.c argues the ordering.)"""
    import ctypes

    rng = np.random.default_rng(7)
    cases = []
    for n in (32, 256):  # ~n / 8 units, at most 16
        q = rng.integers(0, 256, (n, 1, 128), dtype=np.uint8)
        cases.append((rng.standard_normal((1, 128)).astype(np.float32), q, rng.random((n, 1)).astype(np.float32)))
    threads(1)
    expected = [layer.gemv_q8(lib, *c) for c in cases]
    threads(3)
    ctypes.CDLL(lib).qtts_layer_spin_us(spin_us)
    try:
        wrong = sum(not np.array_equal(layer.gemv_q8(lib, *cases[i % 2]), expected[i % 2]) for i in range(4000))
    finally:
        ctypes.CDLL(lib).qtts_layer_spin_us(50)
    assert wrong == 0
