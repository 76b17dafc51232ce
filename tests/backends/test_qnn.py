"""QNN HTP fp16 (onnxruntime-qnn plugin EP, x86 emulation): sessions, plan wiring, fidelity gates.

Gates are a few dB / points under what the tiny checkpoint measured (docs/npu.md):
vocoder step 73.0 dB -> gate 65 dB; predictor logits median 54.4 dB, min 47.9 dB -> gates 48 / 40 dB;
greedy codebooks 1-15 agreement 0.983 (16 frames) -> gate 0.9; `verify_plan`, 4 frames: codebooks 1-15
1.0 -> gate 0.9, vocoder 73.0 dB -> gate 65 dB.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qtts.audio.chunk import snr_db
from qtts.backends.qnn import (
    PlainPredictor,
    QnnBackend,
    QnnOptions,
    QnnVocoder,
    qnn_session,
    session_runner,
    torch_tables,
)
from qtts.backends.torch import TorchBackend
from qtts.engine.generate import PredictorSampler
from qtts.errors import InputError, QttsError
from qtts.options import SamplingParams
from qtts.plans.plan import load_plan
from qtts.weights import load_checkpoint

GREEDY = PredictorSampler(SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0))


@pytest.fixture(scope="module")
def snapshot(tiny_snapshot):
    return tiny_snapshot()


@pytest.fixture(scope="module")
def bundle(snapshot, tmp_path_factory):
    from qtts.export.qnn import export_qnn_bundle

    return export_qnn_bundle(snapshot, str(tmp_path_factory.mktemp("qnn")), codes_length=4)


@pytest.fixture(scope="module")
def checkpoint(snapshot):
    return load_checkpoint(snapshot, components=("talker", "decoder"))


def _erf_model(path) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Erf", ["x"], ["y"])], "erf", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_qnn_session_never_falls_back_to_cpu_silently(tmp_path):
    path = _erf_model(tmp_path / "erf.onnx")  # a lone Erf is not a QNN op (it is only fused into Gelu)
    with pytest.raises(QttsError, match="QNN could not compile"):
        qnn_session(path)
    sess = qnn_session(path, QnnOptions(cpu_fallback=True))  # explicit opt-in runs it on the CPU EP
    x = np.linspace(-2, 2, 8, dtype=np.float32)[None]
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6)


def test_qnn_options_from_plan():
    assert QnnOptions.from_plan(None) == QnnOptions()
    assert QnnOptions.from_plan({"soc_model": 69, "fp16": True}).soc_model == "69"
    with pytest.raises(InputError, match="unknown keys"):
        QnnOptions.from_plan({"socmodel": "57"})


def test_plan_names_qnn_for_predictor_and_vocoder(bundle):
    from qtts.export.verify import plan_precisions

    plan = load_plan(bundle["plan"])
    assert plan.impl("talker") == "torch"
    assert plan.impl("predictor") == plan.impl("vocoder") == "qnn"
    assert plan_precisions(plan)["predictor"] == "qnn/fp16"
    # the predictor graph is plain ONNX: no contrib ops, no Pow (HTP computes Pow(-0, 2) = -4)
    model = onnx.load(bundle["predictor"]["path"])
    assert {n.domain for n in model.graph.node} <= {""}
    assert "Pow" not in bundle["predictor"]["ops"]
    assert all(d.dim_value > 0 for i in model.graph.input for d in i.type.tensor_type.shape.dim)


def test_open_wires_qnn_backend_and_vocoder(snapshot, bundle):
    from qtts.backends import open as open_components

    parts = open_components(snapshot, plan=bundle["plan"], threads=1)
    assert isinstance(parts.backend, QnnBackend)
    assert isinstance(parts.vocoder, QnnVocoder)


def _frames(talker, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    hiddens = rng.standard_normal((n, int(talker.cfg.hidden_size))).astype(np.float32)
    return list(zip(hiddens, rng.integers(0, talker.code_predictor.cfg.vocab_size, n)))


def test_plain_predictor_step_equals_torch_on_cpu(checkpoint, bundle):
    """The export itself is exact: the plain graph on the CPU EP gives the torch backend's codes."""
    talker = checkpoint.model.talker
    cpu = ort.InferenceSession(bundle["predictor"]["path"], providers=["CPUExecutionProvider"])
    plain, ref = _plain(cpu, torch_tables(talker)), TorchBackend(talker, threads=1)
    u = np.zeros(15)
    for h, c0 in _frames(talker, 4, seed=1):
        np.testing.assert_array_equal(
            plain.predict_frame(h, c0, GREEDY, u), ref.predict_frame(h, c0, GREEDY, u)
        )


def test_qnn_predictor_fp16_fidelity(checkpoint, bundle):
    talker = checkpoint.model.talker
    path = bundle["predictor"]["path"]
    tables = torch_tables(talker)
    qnn = _plain(qnn_session(path), tables)
    cpu = _plain(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), tables)
    ref = TorchBackend(talker, threads=1)
    u, agree, snrs = np.zeros(15), [], []
    for h, c0 in _frames(talker, 8):
        codes = ref.predict_frame(h, c0, GREEDY, u)
        agree.append(qnn.predict_frame(h, c0, GREEDY, u) == codes)
        a, b = cpu.frame_logits(h), qnn.frame_logits(h)
        snrs += [snr_db(a(j, c), b(j, c)) for j, c in enumerate([int(c0), *codes[:-1]])]
    assert np.mean(agree) >= 0.9
    assert np.median(snrs) >= 48.0 and min(snrs) >= 40.0


def _plain(session, tables) -> PlainPredictor:
    run, kv = session_runner(session)
    return PlainPredictor(run, *tables, kv)


def test_qnn_vocoder_stream_snr(checkpoint, bundle):
    import torch

    spec = load_plan(bundle["plan"]).get("vocoder")
    dec = QnnVocoder(spec.artifacts["main"], None, spec.options).stream()
    codes = np.random.default_rng(0).integers(0, 2048, (8, 16)).astype(np.int64)
    out = np.concatenate([dec.decode(codes[:4]), dec.decode(codes[4:])])  # state carried across calls
    with torch.inference_mode():
        ref = checkpoint.speech_tokenizer.decoder(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()
    assert out.shape == ref.shape and np.isfinite(out).all()
    # fp16 bound: the plain torch decode in fp16 gives 45.8 dB on this vocoder (its audio follows the
    # codes, activations O(1) through the conv stack); QNN HTP fp16 measured 45.5 dB
    assert snr_db(ref, out) >= 40.0


def test_verify_plan_reports_a_qnn_row(snapshot, bundle):
    from qtts.export.verify import verify_plan

    report = verify_plan(snapshot, bundle["plan"], frames=4, threads=1)
    assert report["components"] == {"talker": "torch/fp32", "predictor": "qnn/fp16", "vocoder": "qnn/fp16"}
    assert report["gated"] is False and report["passed"] is None  # fp16 plans are reported, not gated
    assert report["code0_top1_agreement"] == 1.0  # the talker is the reference torch talker
    assert report["codebooks_1_15_agreement"] >= 0.9
    assert report["vocoder_snr_db"] >= 40.0  # fp16 (see test_qnn_speech_decoder_stream_snr)


def test_soundfile_still_writes_after_a_qnn_session(tmp_path):
    """Fresh process: libsndfile first loaded after a QNN session broke every sf.write; backends/qnn.py loads it first."""
    import subprocess
    import sys

    model = _erf_model(tmp_path / "erf.onnx")
    code = (
        "import numpy as np\n"
        "from qtts.backends.qnn import QnnOptions, qnn_session\n"
        f"qnn_session({model!r}, QnnOptions(cpu_fallback=True)).run(None, {{'x': np.ones((1, 8), np.float32)}})\n"
        "import soundfile as sf\n"
        f"sf.write({str(tmp_path / 'x.wav')!r}, np.zeros(240, np.float32), 24000)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    assert (tmp_path / "x.wav").stat().st_size > 44
