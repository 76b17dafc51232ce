"""A mixed-precision bundle (--weights int4 --mix ...): graph weights at the precisions asked for, the
recipe in the manifest and in `qtts verify plan`'s report, and `qtts say --plan` runs it."""

from __future__ import annotations

import json
import os

import pytest

from qtts.cli import main as qtts_main

MIX = "talker.attn=int8,talker.head=fp32,predictor.heads9-15=int8"


@pytest.fixture(scope="module")
def mixed(snapshot, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mixed") / "b")
    assert qtts_main(["export", "onnx", "-m", snapshot, "-o", out, "--weights", "int4", "--mix", MIX,
                      "--components", "talker", "predictor", "vocoder", "--chunk-frames", "4"]) == 0  # fmt: skip
    return out


def _bits(path: str) -> dict:
    """initializer name -> bits (32 for a plain MatMul weight) over the graph's weight matmuls."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            out[n.input[1].rsplit("_Q", 1)[0]] = {a.name: a.i for a in n.attribute}["bits"]
        elif n.op_type == "MatMul" and n.input[1] in inits:
            out[n.input[1]] = 32
    return out


def test_graph_weights_follow_the_recipe(mixed):
    with open(os.path.join(mixed, "plan.json"), encoding="utf-8") as fh:
        plan = json.load(fh)
    talker = _bits(os.path.join(mixed, plan["talker"]["artifacts"]["main"]))
    assert talker == {"head": 32, **{f"layers.{i}.{k}": 8 if k in ("qkv", "o") else 4
                                     for i in range(2) for k in ("qkv", "o", "gate_up", "down")}}  # fmt: skip
    predictor = _bits(os.path.join(mixed, plan["predictor"]["artifacts"]["main"]))
    assert {k: v for k, v in predictor.items() if k.startswith("step.heads.")} == {
        f"step.heads.{j}": 8 if j + 1 >= 9 else 4 for j in range(15)}  # fmt: skip
    assert {v for k, v in predictor.items() if k.startswith("step.layers.")} == {4}
    batch = _bits(os.path.join(mixed, plan["talker"]["artifacts"]["batch"]))
    assert batch == talker  # the batch graph gets the same recipe
    assert plan["talker"]["precision"] == "int4+int8+fp32" and plan["predictor"]["precision"] == "int4+int8"


def test_manifest_records_the_recipe(mixed):
    with open(os.path.join(mixed, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    assert manifest["options"]["recipe"] == {"talker": "int4", "predictor": "int4", "mix": MIX.split(","), "repair": []}
    q = manifest["graphs"]["talker"]["quantization"]
    assert q["mix"] == ["talker.attn=int8", "talker.head=fp32"] and q["matmuls_by_precision"] == {"int8": 4, "int4": 4}
    assert manifest["graphs"]["predictor"]["quantization"]["mix"] == ["predictor.heads9-15=int8"]


def test_verify_report_has_bits_per_streamed_weight(snapshot, mixed, tmp_path, capsys):
    report = str(tmp_path / "fid.md")
    assert qtts_main(["verify", "plan", "-m", snapshot, "--plan", os.path.join(mixed, "plan.json"),
                      "--frames", "4", "--report", report]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "talker bits per streamed weight" in text and "weight recipe | talker int4, predictor int4; mix " in text
    with open(str(tmp_path / "fid.json"), encoding="utf-8") as fh:
        weights = json.load(fh)["weights"]
    t = weights["talker"]
    # the tiny talker: K = 32 (qkv, gate_up, head) or 64 (o, down), padded to one 128-block per column
    assert t["weights_by_bits"] == {"4": 2 * (32 * 128 + 64 * 32), "8": 2 * (32 * 128 + 64 * 32), "32": 32 * 3072}
    assert 4 < weights["per_frame"]["bits_per_weight"] < 32


def test_say_runs_the_mixed_bundle(snapshot, mixed, tmp_path):
    wav = str(tmp_path / "out.wav")
    assert qtts_main(["say", "-m", snapshot, "--plan", os.path.join(mixed, "plan.json"), "--speaker",
                      _speaker(snapshot), "--max-frames", "6", "--seed", "1", "-q", "-o", wav, "Hi."]) == 0  # fmt: skip
    assert os.path.getsize(wav) > 44


def _speaker(snapshot: str) -> str:
    from qtts.config import ModelConfig

    return ModelConfig.from_dir(snapshot, speech_tokenizer=False).speakers[0]


def test_ladder_script_starts_and_formats_rows():
    import runpy
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", "ladder.py")
    env = {**os.environ, "PYTHONPATH": os.path.join(root, "src")}
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:") and "--bench" in proc.stdout
    mod = runpy.run_path(script)
    assert mod["parse_recipe"]("int4 mse=--weights int4 --repair mse") == ("int4 mse", ["--weights", "int4", "--repair", "mse"])
    row = {"name": "int4", "weights": {"per_frame": {"bits_per_weight": 4.25}}, "talker_logit_snr_db_min": 9.0,
           "talker_logit_snr_db_median": 9.5, "predictor_logit_snr_db_min": None, "predictor_logit_snr_db_median": None,
           "greedy_equal_rate": 0.0, "code0_top1_agreement": 0.5, "codebooks_1_15_agreement": 0.25, "bundle_mb": 12.3}  # fmt: skip
    text = mod["table"]([row])
    assert "| int4 | 4.25 | 9.0 / 9.5 | - / - | 0 % | 50 % | 25 % | 12 | - |" in text
    assert "Random weights test the method, not the real model" in text
