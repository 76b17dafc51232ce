"""SnakeBeta chains -> qtts.kernels::SnakeBeta function nodes (qtts.export.snake) on the tiny vocoder:
without the library the fused graph is the plain graph bit for bit; with it the step stays
>= 100 dB against the torch vocoder and the plain graph. Random weights: this tests the
mechanism, not the real model's audio."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from qtts import kernels
from qtts.audio.chunk import snr_db
from qtts.backends.onnx import OnnxVocoder
from qtts.cli import main as qtts_main
from qtts.export.snake import DOMAIN, OP, fuse_snake, fuse_snake_model
from qtts.export.vocoder import export_vocoder_onnx
from support.vocoder_fixtures import feed, full_decode, load_decoder, random_codes

CHUNKS = (1, 4, 4, 3, 4)


@pytest.fixture(scope="module")
def steps(tiny_snapshot, tmp_path_factory, one_thread):
    snap = tiny_snapshot()
    plain, fused = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("fused")
    counts = {}
    for b in (1, 4):
        export_vocoder_onnx(snap, b, str(plain / f"voc{b}.onnx"))
        shutil.copy(plain / f"voc{b}.onnx", fused / f"voc{b}.onnx")
        counts[b] = fuse_snake(str(fused / f"voc{b}.onnx"))
    codes = random_codes(16, seed=11)
    return {"snap": snap, "plain": plain, "fused": fused, "counts": counts, "codes": codes,
            "torch": full_decode(load_decoder(snap), codes)}  # fmt: skip


def _decode(folder, codes, names=("voc4.onnx", "voc1.onnx")) -> np.ndarray:
    voc = OnnxVocoder(*(str(folder / n) for n in names), threads=2)
    return feed(voc.stream(), codes, list(CHUNKS))


def test_every_snake_chain_becomes_one_function_node(steps):
    import onnx

    from qtts.model.vocoder import SnakeBeta

    snakes = sum(isinstance(m, SnakeBeta) for m in load_decoder(steps["snap"]).modules())
    assert steps["counts"] == {1: snakes, 4: snakes}
    plain, fused = (onnx.load(str(steps[k] / "voc4.onnx")) for k in ("plain", "fused"))
    onnx.checker.check_model(fused)
    assert sum(n.domain == DOMAIN and n.op_type == OP for n in fused.graph.node) == snakes
    sins = [sum(n.op_type == "Sin" for n in m.graph.node) for m in (plain, fused)]
    assert sins[1] == sins[0] - snakes  # what is left is the RoPE angles' Sin
    assert [(f.domain, f.name) for f in fused.functions] == [(DOMAIN, OP)]
    assert fuse_snake(str(steps["fused"] / "voc4.onnx")) == 0  # nothing left to fuse


def test_without_the_library_the_fused_step_is_the_plain_step_bit_for_bit(steps, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "0")
    plain, fused = (_decode(steps[k], steps["codes"]) for k in ("plain", "fused"))
    assert np.array_equal(plain, fused)


def test_with_the_library_it_matches_torch_and_the_plain_graph(steps, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "1")  # also when the suite runs with QTTS_KERNELS=0
    assert kernels.library() is not None, "the kernel library did not build (see the log)"
    with_op = _decode(steps["fused"], steps["codes"])
    monkeypatch.setenv(kernels.ENV, "0")
    plain = _decode(steps["plain"], steps["codes"])
    assert not np.array_equal(with_op, plain)  # the compiled kernel ran, not the inlined body
    assert snr_db(steps["torch"], with_op) >= 100.0
    assert snr_db(plain, with_op) >= 100.0
    assert snr_db(steps["torch"], plain) >= 100.0


def test_no_compiler_means_one_warning_and_the_plain_output(steps, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(kernels.ENV, "1")
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "missing-cc"))
    monkeypatch.setattr(kernels, "_built", {})
    with caplog.at_level(logging.WARNING, logger="qtts.kernels"):
        fused = _decode(steps["fused"], steps["codes"])
    assert len(caplog.records) == 1 and "plain vocoder graph" in caplog.records[0].getMessage()
    monkeypatch.setenv(kernels.ENV, "0")
    assert np.array_equal(fused, _decode(steps["plain"], steps["codes"]))


def _chain_model(coeff_dims: list, extra_output: bool = False):
    from onnx import TensorProto, helper, numpy_helper

    c = 3
    mk = helper.make_node
    nodes = [mk("Mul", ["x", "a"], ["v"]), mk("Sin", ["v"], ["s"]), mk("Mul", ["s", "s"], ["s2"]),
             mk("Mul", ["b", "s2"], ["t"]), mk("Add", ["x", "t"], ["y"])]  # fmt: skip
    coeff = np.linspace(0.5, 1.5, c, dtype=np.float32).reshape(coeff_dims)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8])]
    if extra_output:
        outs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, c, 8]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8])], outs,
                              [numpy_helper.from_array(coeff, "a"), numpy_helper.from_array(coeff, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_rewrite_only_takes_whole_chains():
    assert fuse_snake_model(_chain_model([1, 3, 1])) == 1
    assert fuse_snake_model(_chain_model([1, 3, 1], extra_output=True)) == 0  # sin(a x) is used elsewhere
    assert fuse_snake_model(_chain_model([3, 1])) == 0  # not a [1, C, 1] per-channel coefficient


def test_a_bundle_runs_with_and_without_the_library(tiny_snapshot, tmp_path, monkeypatch, steps):
    """The bundle export fuses by default; with QTTS_KERNELS=0 it decodes exactly like a bundle
    exported plain (vocoder_kernels=False), with the library >= 100 dB against torch."""
    from qtts.export.onnx import ExportOptions, export_bundle

    out = str(tmp_path / "bundle")
    argv = ["export", "onnx", "-m", tiny_snapshot(), "-o", out, "--components", "vocoder",
            "--vocoder-first", "1", "--vocoder-main", "4"]  # fmt: skip
    assert qtts_main(argv) == 0
    plain = tmp_path / "plain"
    export_bundle(tiny_snapshot(), str(plain), ExportOptions(components=("vocoder",), vocoder_main=4,
                                                             vocoder_kernels=False))  # fmt: skip
    bundle, names = tmp_path / "bundle", ("vocoder.b4.onnx", "vocoder.b1.onnx")
    assert os.path.isfile(bundle / "vocoder.shared.json")
    monkeypatch.setenv(kernels.ENV, "1")
    with_op = _decode(bundle, steps["codes"], names)
    monkeypatch.setenv(kernels.ENV, "0")
    without = _decode(bundle, steps["codes"], names)
    assert np.array_equal(without, _decode(plain, steps["codes"], names))
    assert snr_db(steps["torch"], with_op) >= 100.0 and not np.array_equal(with_op, without)
