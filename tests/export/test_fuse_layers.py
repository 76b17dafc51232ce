"""Decoder layers of the int8 predictor frame -> qtts.kernels::DecoderLayer function nodes
(qtts.export.fuse) on the tiny checkpoint with a predictor of the kernel's widths (hidden and head dim
128): without the library the fused frame is the plain frame bit for bit; with it the compiled layer
runs and stays within int8 activation rounding of the plain graph. The tiny checkpoint's own predictor
(widths 32 / 16) is left plain. Random weights: this tests the mechanism, not how the real model
reacts to quantization."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest

from qtts import kernels
from qtts.audio.chunk import snr_db
from qtts.export.fuse import DOMAIN, OP, fuse_layers, fuse_layers_model

PASSES = 15


def _export(talker, path: str, precision: str, repair: str) -> None:
    from qtts.export.onnx import export_predictor_frame
    from qtts.export.quantize import quantize_file
    from qtts.export.recipe import for_talker

    export_predictor_frame(talker, path, rotate="rotate" in repair)
    quantize_file(path, "predictor", for_talker(talker, precision, precision, None, repair), 128)


def _kernel_shaped(tiny: str, out) -> str:
    """``tiny`` with a predictor of the kernel's widths: hidden 128, 2 heads on 1 of 128, MLP 256 (the
    talker's heads of 128 too: the exporter shares one RoPE table)."""
    from qtts.config import ModelConfig
    from qtts.tools import random_weights as rw

    shutil.copytree(tiny, out)
    with open(out / "config.json", encoding="utf-8") as fh:
        cfg = json.load(fh)
    cfg["talker_config"]["code_predictor_config"].update(
        hidden_size=128, head_dim=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)
    cfg["talker_config"].update(head_dim=128, num_attention_heads=2, num_key_value_heads=1)  # one RoPE table
    cfg["talker_config"]["rope_scaling"]["mrope_section"] = [32, 16, 16]  # sums to head_dim / 2
    with open(out / "config.json", "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    specs = rw.main_specs(ModelConfig.from_dict(copy.deepcopy(cfg)))
    rw.write_safetensors(str(out / "model.safetensors"), specs, 0, 0.05, "float32", {})
    return str(out)


@pytest.fixture(scope="module")
def frames(tiny_snapshot, tmp_path_factory):
    from qtts.weights import load_checkpoint

    root = tmp_path_factory.mktemp("fuse-layers")
    snapshot = _kernel_shaped(tiny_snapshot(kind="custom_voice"), root / "snapshot")
    talker = load_checkpoint(snapshot, components=("talker",)).model.talker.eval()
    _export(talker, str(root / "plain.onnx"), "int8", "rotate")
    shutil.copy(root / "plain.onnx", root / "fused.onnx")
    shutil.copy(root / "plain.onnx.data", root / "fused.onnx.data")
    count = fuse_layers(str(root / "fused.onnx"))
    return {"root": root, "count": count, "layers": talker.code_predictor.cfg.num_hidden_layers, "talker": talker,
            "snapshot": snapshot}


def _feeds(hidden_size: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    base = {"hidden": rng.standard_normal((1, hidden_size)).astype(np.float32), "code0": np.array([7], np.int64),
            "uniforms": rng.random(PASSES).astype(np.float32), "temperature": np.array([0.9], np.float32),
            "top_k": np.array([50], np.int64), "top_p": np.array([1.0], np.float32)}  # fmt: skip
    return [dict(base, do_sample=np.array([flag])) for flag in (False, True)]


def _run(path, feeds: list, library: bool) -> list:
    from qtts.backends.onnx import open_session, session_options

    so = session_options(2)
    if library:
        assert kernels.register(so), "the kernel library did not build (see the log)"
    session = open_session(str(path), options=so)
    return [session.run(None, f) for f in feeds]


def test_every_layer_of_every_pass_becomes_one_function_node(frames):
    import onnx

    assert frames["count"] == frames["layers"] * PASSES
    fused = onnx.load(str(frames["root"] / "fused.onnx"), load_external_data=False)
    assert sum(n.domain == DOMAIN and n.op_type == OP for n in fused.graph.node) == frames["count"]
    assert not any(n.op_type in ("GroupQueryAttention", "Sigmoid") for n in fused.graph.node)
    assert [(f.domain, f.name) for f in fused.functions] == [(DOMAIN, OP)]
    assert fuse_layers(str(frames["root"] / "fused.onnx")) == 0  # nothing left to fuse


def test_without_the_library_the_fused_frame_is_the_plain_frame_bit_for_bit(frames):
    feeds = _feeds(frames["talker"].cfg.hidden_size, seed=3)
    plain, fused = (_run(frames["root"] / f"{k}.onnx", feeds, library=False) for k in ("plain", "fused"))
    for a, b in zip(plain, fused):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_with_the_library_the_layer_kernel_runs_within_rounding(frames):
    feeds = _feeds(frames["talker"].cfg.hidden_size, seed=5)
    plain = _run(frames["root"] / "plain.onnx", feeds, library=False)
    fused = _run(frames["root"] / "fused.onnx", feeds, library=True)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(plain, fused))  # the compiled layer ran
    for a, b in zip(plain, fused):
        assert snr_db(a[1], b[1]) >= 60.0
        assert np.mean(a[0] == b[0]) >= 14 / 15  # a code can flip only where two logits tie within rounding


@pytest.mark.parametrize(("repair", "widths"), [("", 128), ("rotate", 32)])
def test_other_layouts_are_left_plain(frames, tiny_snapshot, repair, widths):
    """The unrotated MLP and the tiny checkpoint's own widths (32, head dim 16): real exports."""
    import onnx

    from qtts.weights import load_checkpoint

    talker = frames["talker"] if widths == 128 else load_checkpoint(
        tiny_snapshot(kind="custom_voice"), components=("talker",)).model.talker.eval()  # fmt: skip
    path = str(frames["root"] / f"other-{repair or 'plain'}-{widths}.onnx")
    _export(talker, path, "int8", repair)
    model = onnx.load(path)
    before = model.SerializeToString()
    assert fuse_layers_model(model) == 0
    assert model.SerializeToString() == before


@pytest.mark.parametrize(("attr", "value"), [("bits", 4), ("block_size", 64), ("accuracy_level", 0)])
def test_a_gemv_of_another_kind_keeps_the_graph_plain(frames, attr, value):
    """Every layer's output projection of another layout (int4, other blocks, float activations): no
    layer is rewritten, since the kernel would compute it differently."""
    import onnx

    model = onnx.load(str(frames["root"] / "plain.onnx"), load_external_data=False)
    attention = {n.output[0] for n in model.graph.node if n.op_type == "GroupQueryAttention"}
    for gemv in (n for n in model.graph.node if n.op_type == "MatMulNBits" and n.input[0] in attention):
        next(a for a in gemv.attribute if a.name == attr).i = value
    before = model.SerializeToString()
    assert fuse_layers_model(model) == 0
    assert model.SerializeToString() == before


def test_export_onnx_predictor_kernels_is_opt_in(frames, monkeypatch):
    """``qtts export onnx --predictor-kernels`` records the fused layers in the bundle's manifest and
    the runtime registers the library for them (the op runs); without the flag, as in every preset,
    the predictor graph keeps its plain layers."""
    from qtts.backends import open as open_components
    from qtts.cli import main
    from qtts.export.onnx import ExportOptions

    assert ExportOptions().predictor_kernels is False
    out = str(frames["root"] / "bundle")
    flags = ["--weights", "int8", "--repair", "rotate", "--no-batch-graphs", "--components", "talker", "predictor"]
    assert main(["export", "onnx", "-m", frames["snapshot"], "-o", out, *flags, "--predictor-kernels"]) == 0
    with open(f"{out}/manifest.json", encoding="utf-8") as fh:
        kernels_meta = json.load(fh)["graphs"]["predictor"]["kernels"]
    assert kernels_meta == {f"{DOMAIN}::{OP}": frames["count"]}
    backend = open_components(frames["snapshot"], f"{out}/plan.json").backend
    feeds = _feeds(frames["talker"].cfg.hidden_size, seed=5)[0]
    with_op = backend.predictor_sess.run(None, feeds)
    plain = _run(frames["root"] / "fused.onnx", [feeds], library=False)[0]
    assert not np.array_equal(with_op[1], plain[1])  # the compiled layer ran in the product's session


def test_predictor_kernels_on_a_model_it_does_not_fit_warns(tiny_snapshot, tmp_path, caplog):
    """The tiny checkpoint's widths (32) do not fit the kernel: the export keeps the plain layers and
    says why, rather than leaving the flag silently without effect."""
    from qtts.cli import main

    flags = ["--weights", "int8", "--repair", "rotate", "--no-batch-graphs", "--components", "talker", "predictor"]
    with caplog.at_level("WARNING", logger="qtts.export.onnx"):
        assert main(["export", "onnx", "-m", tiny_snapshot(kind="custom_voice"), "-o", str(tmp_path / "b"), *flags,
                     "--predictor-kernels"]) == 0  # fmt: skip
    assert "--predictor-kernels: no predictor layer has the kernel's layout" in caplog.text
    with open(tmp_path / "b" / "manifest.json", encoding="utf-8") as fh:
        assert json.load(fh)["graphs"]["predictor"]["kernels"] == {f"{DOMAIN}::{OP}": 0}
