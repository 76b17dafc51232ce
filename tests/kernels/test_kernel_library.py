"""The optional compiled kernels (qtts.kernels): the build, every code path of the SnakeBeta kernel
against float64, the onnxruntime op, and what happens without a compiler or with QTTS_KERNELS=0.

CI builds the library (scripts/test.sh installs gcc when it is missing), so the tests that need it
fail, never skip, when it cannot be built."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from qtts import kernels
from qtts.kernels import selftest
from support.kernel_fixtures import kernel_fixtures

lib, _kernels_on = kernel_fixtures()


def _kernel(path: str):
    fn = ctypes.CDLL(path).qtts_snake_beta
    ptr = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    return fn


def _run(path: str, x: np.ndarray, a: np.ndarray, b: np.ndarray, isa: str | None) -> np.ndarray | None:
    """The kernel on x [rows, C, T] through ctypes; None when ``isa`` is not available here."""
    y = np.empty_like(x)
    x, a, b, y_ = (v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for v in (x, a, b, y))
    rows, (c, t) = y.shape[0] * y.shape[1], y.shape[1:]
    rc = _kernel(path)(x, a, b, y_, rows, c, t, isa.encode() if isa else None)
    return None if rc != 0 else y


def _isas() -> list[str]:
    """The code paths this CPU has, best last: x86-64 adds AVX2 / AVX-512 by its flags, arm64 NEON
    (AdvSIMD is part of every AArch64 CPU; benchmarks/arm.sh runs these tests on an emulated one)."""
    found = ["generic"]
    if os.uname().machine in ("aarch64", "arm64"):
        found.append("neon")
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64":
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = set(next(line for line in fh if line.startswith("flags")).split())
        found += [isa for isa, need in (("avx2", {"avx2", "fma"}), ("avx512", {"avx512f"})) if need <= flags]
    return found


@pytest.mark.parametrize("isa", ["avx512", "avx2", "neon", "generic"])
@pytest.mark.parametrize("shape", [(1, 5, 37), (2, 3, 20011), (1, 16, 1)])
def test_every_code_path_matches_float64(lib, isa, shape):
    x, a, b = selftest.inputs(shape, seed=sum(shape))
    got = _run(lib, x, a, b, isa)
    if isa not in _isas():
        assert got is None  # refused, not run on a CPU without it
        return
    assert got is not None
    ref = selftest.reference(x, a, b)
    assert selftest.check(x, got, ref) is None
    assert selftest.snr_db(ref, got) >= 100.0


def test_paths_agree_and_unknown_names_are_refused(lib):
    x, a, b = selftest.inputs((1, 8, 4099), seed=5)
    outs = [_run(lib, x, a, b, isa) for isa in _isas()]
    for y in outs[1:]:  # FMA vs plain C rounding differs in the last bits only
        assert selftest.snr_db(outs[0].astype(np.float64), y) >= 120.0
    assert _run(lib, x, a, b, "sse9") is None
    assert kernels.isa(lib) == _isas()[-1]  # the best path this CPU has


@pytest.mark.parametrize("forced", ["generic", "neon", "avx2", "sse9"])
def test_qtts_kernels_isa_forces_a_path_or_falls_back_to_the_best(lib, forced):
    """The library picks its path once, at load, from QTTS_KERNELS_ISA: a path this CPU has is
    taken, anything else (another architecture's, a made-up name) gives the best one."""
    code = f"import ctypes; f = ctypes.CDLL({lib!r}).qtts_kernels_isa; f.restype = ctypes.c_char_p; print(f().decode())"
    env = {**os.environ, "QTTS_KERNELS_ISA": forced}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert out.stdout.strip() == (forced if forced in _isas() else _isas()[-1])


def test_the_selftest_passes_and_rejects_a_non_library(lib, tmp_path):
    ok = subprocess.run([sys.executable, selftest.__file__, lib], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("ok "), ok.stderr[-2000:]
    bogus = tmp_path / "libbogus.so"
    bogus.write_bytes(b"not a shared object")
    line, reason = kernels._selftest(str(bogus))
    assert line == "" and "self-test failed" in reason


def _session(lib_path: str | None, dims: tuple, threads: int, coeff: tuple | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if lib_path:
        so.register_custom_ops_library(lib_path)
    return ort.InferenceSession(selftest.snake_model(dims, coeff), so, providers=["CPUExecutionProvider"])


def test_the_onnxruntime_op_is_the_same_on_one_and_two_threads(lib):
    dims = (1, 1, 4, 50000)  # a stacked step's [S, 1, C, T]: the channel axis is the one before last
    x, a, b = selftest.inputs(dims, seed=2)
    one, two = (_session(lib, dims, t).run(None, {"x": x, "a": a, "b": b})[0] for t in (1, 2))
    assert np.array_equal(one, two)
    assert selftest.check(x, two, selftest.reference(x, a, b)) is None


def test_the_op_refuses_coefficients_of_the_wrong_size(lib):
    import onnxruntime as ort

    dims = (1, 4, 100)
    x, a, b = selftest.inputs(dims)
    s = _session(lib, dims, 1, coeff=(1, 3, 1))
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="C values"):
        s.run(None, {"x": x, "a": a[:, :3], "b": b[:, :3]})
    bad_rank = _session(lib, (4, 100), 1)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=r"\[\.\.\., C, T\]"):
        bad_rank.run(None, {"x": x[0], "a": a, "b": b})


def test_off_switch(monkeypatch, lib):
    import onnxruntime as ort

    monkeypatch.setenv(kernels.ENV, "0")
    assert kernels.library() is None
    assert kernels.register(ort.SessionOptions()) is False
    monkeypatch.setenv(kernels.ENV, "1")
    assert kernels.library() == lib


def test_no_compiler_warns_once_and_is_remembered(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(kernels, "_built", {})
    with caplog.at_level(logging.INFO, logger="qtts.kernels"):
        assert kernels.library() is None and kernels.library() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no C compiler" in warnings[0].getMessage()
    assert "apt-get install gcc" in warnings[0].getMessage()
    caplog.clear()
    monkeypatch.setattr(kernels, "_built", {})  # the next process: the recorded failure, said quietly
    with caplog.at_level(logging.INFO, logger="qtts.kernels"):
        assert kernels.library() is None
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_a_failing_compiler_is_recorded_and_force_retries(monkeypatch, tmp_path):
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # runs, exits 1
    first = kernels.build()
    assert first.path is None and "exited 1" in first.reason
    folder = os.path.join(kernels.kernels_root(), kernels.build_key(kernels.compiler()))
    assert os.path.isfile(os.path.join(folder, kernels.FAILED))
    assert "recorded" in kernels.build().reason
    monkeypatch.setenv("CC", "true")  # "compiles" nothing: the self-test then fails on the empty file
    retried = kernels.build(force=True)
    assert retried.path is None and "self-test" in retried.reason
    assert not [n for n in os.listdir(folder) if n.startswith(".qtts-")]  # no temp files left


def test_a_fresh_build_publishes_a_tested_library(monkeypatch, tmp_path):
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path))
    result = kernels.build()
    assert result.path and result.fresh and result.selftest.startswith("ok ")
    assert os.path.dirname(result.path).startswith(str(tmp_path))
    again = kernels.build()
    assert again.path == result.path and not again.fresh


def test_the_cli_builds_and_reports(lib, capsys, monkeypatch, tmp_path):
    from qtts.cli import main as qtts_main

    assert qtts_main(["kernels", "build"]) == 0
    assert f"{lib}: already built; code path {_isas()[-1]}" in capsys.readouterr().out
    assert qtts_main(["kernels", "status"]) == 0
    assert capsys.readouterr().out.startswith(f"built: {lib}")
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    assert qtts_main(["kernels", "build"]) == 1
    assert "apt-get install gcc" in capsys.readouterr().err
    assert qtts_main(["kernels", "status"]) == 0
    assert capsys.readouterr().out.startswith("failed: no C compiler")
