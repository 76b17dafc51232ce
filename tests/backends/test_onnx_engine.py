"""ONNX engine on a tiny checkpoint: export fp32/int8/int4, torch == ONNX greedy codes, verify gates,
deterministic export."""

from __future__ import annotations

import filecmp
import json
import os

import numpy as np
import pytest

from qtts.cli import main as qtts_main


def _export(snapshot: str, out: str, *extra: str) -> dict:
    assert qtts_main(["export", "onnx", "--model", snapshot, "-o", out, *extra]) == 0
    with open(os.path.join(out, "plan.json"), encoding="utf-8") as fh:
        return json.load(fh)


#: the fp32 bundle of every component with small vocoder steps (shared with test_no_torch_runtime.py)
FP32 = ("custom_voice", "--vocoder-first", "2", "--vocoder-main", "4")


@pytest.fixture(scope="module")
def fp32_bundle(tiny_bundle):
    return tiny_bundle(*FP32)


@pytest.fixture(scope="module")
def quantized_bundles(snapshot, tmp_path_factory):
    root = tmp_path_factory.mktemp("onnxq")
    out = {}
    for precision in ("int8", "int4"):
        out[precision] = str(root / precision)
        _export(snapshot, out[precision], "--weights", precision, "--components", "talker", "predictor")
    return out


def _backends(snapshot: str, bundle: str):
    from qtts.backends import open as open_components
    from qtts.backends.torch import TorchBackend
    from qtts.weights import load_checkpoint

    ckpt = load_checkpoint(snapshot, components=("talker",))
    return TorchBackend(ckpt.model.talker), open_components(snapshot, os.path.join(bundle, "plan.json")).backend


def _greedy_codes(backend, frames: int, seed: int = 0) -> np.ndarray:
    """Greedy talker + predictor frames from a fixed random prompt through the real loop."""
    from qtts.engine.generate import generate
    from qtts.options import LoopParams, SamplingParams

    rng = np.random.default_rng(seed)
    prompt = type("P", (), {})()
    prompt.text_ids = [151644, 77091, 198, int(rng.integers(1000, 5000)), 151672]
    prompt.codec_ids = [-1, -1, -1, 2155, 2149]
    prompt.trailing_text_ids = [int(i) for i in rng.integers(1000, 5000, 6)]
    prompt.speaker_pos, prompt.icl_frame, prompt.icl_codes = -1, None, None
    greedy = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.05)
    lp = LoopParams(
        talker=greedy, predictor=greedy, max_frames=frames, tts_pad_id=151671, watchdog=None, seed=0
    )
    return np.asarray(list(generate(backend, prompt, lp)), dtype=np.int64)


def test_fp32_bundle_layout_and_manifest(fp32_bundle, snapshot):
    from qtts.export.onnx import checkpoint_hash
    from qtts.plans.plan import fingerprint, load_plan

    plan = load_plan(os.path.join(fp32_bundle, "plan.json"))
    for name in ("talker", "predictor", "vocoder"):
        assert plan.get(name).impl == "onnx"
        assert os.path.isfile(plan.get(name).artifact("main"))
    assert os.path.isfile(plan.get("vocoder").artifact("first"))
    with open(os.path.join(fp32_bundle, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    assert manifest["source"]["checkpoint_sha256"] == checkpoint_hash(snapshot)
    assert manifest["source"]["fingerprint"] == fingerprint(snapshot)
    assert manifest["opset"] == 17
    assert manifest["precision"] == {"talker": "fp32", "predictor": "fp32", "vocoder": "fp32"}


def test_torch_and_onnx_fp32_greedy_codes_equal(fp32_bundle, snapshot):
    ref, test = _backends(snapshot, fp32_bundle)
    a, b = _greedy_codes(ref, 12), _greedy_codes(test, 12)
    assert a.shape == (12, 16)
    np.testing.assert_array_equal(a, b)


def test_fused_frame_sampling_matches_numpy_sampler(fp32_bundle, snapshot):
    """The in-graph sampler of the fused ONNX predictor picks what qtts.engine.generate picks for the same
    uniforms: the expected codes come from the torch predictor's logits, step by step, through
    the loop's sampler (``PredictorSampler.frame``, qtts.engine.generate), not from a backend."""
    import torch

    from qtts.engine.generate import PredictorSampler
    from qtts.options import SamplingParams
    from qtts.weights import load_checkpoint

    talker = load_checkpoint(snapshot, components=("talker",)).model.talker
    cp = talker.code_predictor
    _, test = _backends(snapshot, fp32_bundle)
    rng = np.random.default_rng(3)
    hidden = rng.standard_normal(test.hidden_size).astype(np.float32)
    state = {}

    @torch.no_grad()
    def step_logits(j: int, code: int) -> np.ndarray:
        ids = torch.tensor([[code]])
        if j == 0:
            x, pos, state["cache"] = torch.cat([torch.from_numpy(hidden)[None, None], talker.embed_codec(ids)], 1), 0, cp.new_cache(17)
        else:
            x, pos = cp.embed(j - 1, ids), j + 1
        out, state["cache"] = cp(x, pos, state["cache"])
        return cp.head(j, out[0, -1]).numpy()

    greedy = PredictorSampler(SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0))
    for top_k, top_p in ((50, 1.0), (0, 0.8), (7, 0.5)):
        params = PredictorSampler(SamplingParams(
            do_sample=True, temperature=0.9, top_k=top_k, top_p=top_p, repetition_penalty=1.0
        ))
        u = rng.random(15)
        want = params.frame(step_logits, 17, u)
        np.testing.assert_array_equal(test.predict_frame(hidden, 17, params, u), want)
        assert not np.array_equal(want, greedy.frame(step_logits, 17, u))  # sampling mattered


def test_verify_plan_fp32_gates_pass(fp32_bundle, snapshot, tmp_path):
    report_path = str(tmp_path / "fid.md")
    code = qtts_main(["verify", "plan", "--model", snapshot, "--plan", os.path.join(fp32_bundle, "plan.json"),
                      "--frames", "10", "--report", report_path])  # fmt: skip
    assert code == 0
    with open(str(tmp_path / "fid.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["passed"] is True
    assert report["greedy_equal_rate"] == 1.0 and report["greedy_first_divergent_frame"] is None
    assert report["code0_top1_agreement"] == 1.0 and report["codebooks_1_15_agreement"] == 1.0
    assert report["vocoder_snr_db"] >= 80.0
    assert report["predictor_logit_snr_db_min"] >= 60.0 and report["talker_logit_snr_db_min"] >= 60.0
    assert report["default_gate"] is True
    text = open(report_path, encoding="utf-8").read()
    assert "PASS" in text and "predictor logit SNR" in text


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_bundles_run(snapshot, quantized_bundles, precision):
    import onnx

    out = quantized_bundles[precision]
    with open(os.path.join(out, "plan.json"), encoding="utf-8") as fh:
        plan = json.load(fh)
    assert plan["talker"]["precision"] == plan["predictor"]["precision"] == precision
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as fh:
        q = json.load(fh)["graphs"]["talker"]["quantization"]
    assert (
        q["bits"] == {"int8": 8, "int4": 4}[precision] and q["accuracy_level"] == 4 and q["block_size"] == 128
    )
    graph = onnx.load(os.path.join(out, plan["talker"]["artifacts"]["main"]), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert "MatMulNBits" in ops and "MatMul" not in ops  # every weight matmul quantized
    ref, test = _backends(snapshot, out)
    codes = _greedy_codes(test, 6)
    assert codes.shape == (6, 16) and codes.min() >= 0 and codes[:, 1:].max() < 2048


def test_step_mode_predictor_equals_torch(snapshot, tmp_path):
    out = str(tmp_path / "step")
    _export(snapshot, out, "--predictor-mode", "step", "--components", "talker", "predictor")
    ref, test = _backends(snapshot, out)
    np.testing.assert_array_equal(_greedy_codes(ref, 6, seed=1), _greedy_codes(test, 6, seed=1))


def test_export_is_deterministic(snapshot, quantized_bundles, tmp_path):
    a, b = quantized_bundles["int4"], str(tmp_path / "again")
    _export(snapshot, b, "--weights", "int4", "--components", "talker", "predictor")
    names = sorted(os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a) for f in fs)
    assert names == sorted(os.path.relpath(os.path.join(r, f), b) for r, _, fs in os.walk(b) for f in fs)
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert mismatch == [] and errors == [] and len(match) == len(names) > 5


def test_speaker_encoder_onnx_matches_torch(tiny_snapshot, tmp_path):
    from qtts.backends.onnx import OnnxSpeakerEncoder
    from qtts.backends.torch import TorchSpeakerEncoder
    from qtts.weights import load_checkpoint

    snapshot = tiny_snapshot(kind="base")
    plan = _export(snapshot, str(tmp_path / "spk"), "--components", "speaker_encoder", "speech_encoder")
    enc = OnnxSpeakerEncoder(str(tmp_path / "spk" / plan["speaker_encoder"]["artifacts"]["main"]))
    ckpt = load_checkpoint(snapshot, components=("speaker_encoder",))
    rng = np.random.default_rng(0)
    for n in (24000 * 2, 24000 * 3 + 517):  # the frame axis is dynamic
        wav = (0.3 * np.sin(np.arange(n) * 0.05) + 0.05 * rng.standard_normal(n)).astype(np.float32)
        ref = TorchSpeakerEncoder(ckpt.model.speaker_encoder).embed(wav)
        np.testing.assert_allclose(enc.embed(wav), ref, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
    # the runtime uses the exported encoder when the plan names it (create_voice without torch's encoder)
    import qtts

    tts_onnx = qtts.load(snapshot, plan=str(tmp_path / "spk" / "plan.json"), threads=1)
    tts_torch = qtts.load(snapshot, threads=1)
    wav = (0.3 * np.sin(np.arange(24000 * 2) * 0.05)).astype(np.float32)
    got = tts_onnx.create_voice(wav, sample_rate=24000, ref_text="A reference.")
    ref = tts_torch.create_voice(wav, sample_rate=24000, ref_text="A reference.")
    tol = 1e-5 * max(1.0, float(np.abs(ref.speaker).max()))
    np.testing.assert_allclose(got.speaker, ref.speaker, atol=tol)
    assert got.ref_codes.shape == ref.ref_codes.shape == (25, 16)  # ICL codes from the ONNX encoder
    np.testing.assert_array_equal(got.ref_codes, ref.ref_codes)


def test_bench_side_by_side_with_official(snapshot, fp32_bundle, quantized_bundles, tmp_path, capsys):
    """`qtts bench` on the tiny checkpoint: two plans and the official code in one run -> table, JSON, PNG."""
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--model", snapshot, "--plan", os.path.join(fp32_bundle, "plan.json"),
            "--plan", os.path.join(quantized_bundles["int8"], "plan.json"), "--frames", "6", "--repeats", "1",
            "--threads", "1", "--compare-official", "--json", str(out_json), "--plot", str(out_png)]  # fmt: skip
    assert qtts_main(argv) == 0
    text = capsys.readouterr().out
    assert "| plan | talker ms/frame |" in text and "official qwen-tts fp32" in text and "Speed-up" in text
    assert "talker onnx int8, predictor onnx int8, vocoder torch fp32 (block 128)" in text  # block from the manifest
    data = json.loads(out_json.read_text())
    assert [r["frames"] for r in data["results"]] == [6, 6] and data["official"]["frames"] == 6
    for r in data["results"]:
        assert r["rtf"] > 0 and r["ttfa_ms"] > 0 and r["talker_ms"] > 0 and r["vocoder_ms"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flag,path,words", [("--plot", "out.svg", "ending in .png"),
                                             ("--json", "missing/out.json", "does not exist")])
def test_bench_refuses_bad_output_paths_before_running(snapshot, tmp_path, capsys, flag, path, words):
    argv = ["bench", "--model", snapshot, "--frames", "4", "--repeats", "1", flag, str(tmp_path / path)]
    assert qtts_main(argv) == 2
    assert words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing benchmarked
