"""ONNX export of the vocoder step: contract read back, RKNN preflight, onnxruntime == torch offline."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from qtts.audio.chunk import snr_db
from qtts.backends.onnx import OnnxVocoder
from qtts.cli import main
from qtts.errors import InputError
from qtts.export.vocoder import RISKY_OPS, export_vocoder_onnx, kv_concat_nodes
from support.vocoder_fixtures import feed, full_decode, load_decoder, random_codes


@pytest.fixture(scope="module")
def exported(tiny_snapshot, tmp_path_factory, one_thread):
    snap = tiny_snapshot()
    out = tmp_path_factory.mktemp("voc-onnx")
    main_r = export_vocoder_onnx(snap, 4, str(out / "voc4.onnx"))
    first_r = export_vocoder_onnx(snap, 2, str(out / "voc2.onnx"))
    decoder = load_decoder(snap)
    codes = random_codes(150, seed=5)
    return snap, main_r, first_r, decoder, codes, full_decode(decoder, codes)


def test_contract_is_read_back_from_the_file(exported):
    _, main_r, first_r, decoder, _, _ = exported
    c = OnnxVocoder(main_r["path"]).contract
    assert (c.codes_length, c.head_dim, c.kv_slots, c.samples_per_frame) == (4, 16, 71, 1920)
    assert c.cache_size == main_r["cache_size"] == OnnxVocoder(first_r["path"]).contract.cache_size
    assert len(c.inv_freq) == decoder.config.head_dim // 2


def test_graph_is_rknn_friendly(exported):
    for r in exported[1:3]:
        assert r["risky_ops"] == [], r["ops"]
        assert r["kv_concat"] == []
        assert r["softmax"] == 2  # one attention per layer, all checked
        assert not set(r["ops"]) & set(RISKY_OPS)


def test_kv_concat_check_detects_a_concat_join():
    import onnx
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Concat", ["hist", "cur"], ["k"], axis=1, name="join"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "k"], ["o"]),
    ]
    ins = [
        helper.make_tensor_value_info(n, f, s)
        for n, s in (("hist", [1, 3, 4]), ("cur", [1, 2, 4]), ("q", [1, 2, 4]))
    ]
    graph = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("o", f, [1, 2, 4])])
    onnx.checker.check_model(helper.make_model(graph))
    assert kv_concat_nodes(graph) == ["join", "join"]


def test_onnxruntime_stepwise_matches_torch_offline(exported):
    _, main_r, first_r, _, codes, ref = exported
    dec = OnnxVocoder(main_r["path"], first_r["path"], threads=1).stream()
    out = feed(dec, codes, [2, 8, 7, 3, 1, 16])  # odd sizes exercise the pad + pending path
    assert snr_db(ref, out) >= 80.0
    dec.reset()
    assert snr_db(ref[: 12 * 1920], feed(dec, codes[:12], [12])) >= 80.0


def test_plan_selects_the_onnx_vocoder(exported, tmp_path):
    from qtts.backends import open as open_components

    snap, main_r, first_r, _, codes, ref = exported
    plan = tmp_path / "plan.json"
    rel = os.path.relpath(main_r["path"], tmp_path)
    plan.write_text(json.dumps({"vocoder": {"impl": "onnx", "artifacts": {"main": rel, "first": first_r["path"]}}}))
    parts = open_components(snap, plan=str(plan), threads=1)
    assert isinstance(parts.vocoder, OnnxVocoder) and parts.vocoder.sizes == [4, 2]
    assert snr_db(ref[: 20 * 1920], feed(parts.vocoder.stream(), codes[:20], [2, 8])) >= 80.0
    # the runtime's thread count reaches the vocoder sessions (qtts.load(..., threads=1))
    assert {s.get_session_options().intra_op_num_threads for s in parts.vocoder.sessions.values()} == {1}


def test_non_step_onnx_is_rejected(exported, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])  # fmt: skip
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(InputError, match="not a qtts vocoder step"):
        OnnxVocoder(str(path))


def test_cli_export_and_verify_exit_codes(exported, tmp_path, capsys):
    snap = exported[0]
    out = tmp_path / "v2.onnx"
    assert (
        main(["export", "vocoder", "--model", snap, "--codes-length", "2", "-o", str(out), "--frames", "24"])
        == 0
    )
    text = capsys.readouterr().out
    assert "risky ops for rknn-toolkit2: none" in text and '"impl": "onnx"' in text and out.is_file()
    assert main(["export", "vocoder", "--model", snap, "--codes-length", "0", "-o", str(out)]) == 2
    assert (
        main(["export", "vocoder", "--model", snap, "--codes-length", "2", "-o", str(tmp_path / "x.bin")])
        == 2
    )
    assert (
        main(["verify", "vocoder", "--model", snap, "--frames", "80", "--chunks", "2,16", "--chunks", "5"])
        == 0
    )
    assert "SNR" in capsys.readouterr().out
    assert (
        main(["verify", "vocoder", "--model", snap, "--frames", "20", "--chunks", "4", "--gate", "1000"]) == 1
    )
    assert main(["verify", "vocoder", "--model", snap, "--chunks", "a,b"]) == 2


def test_say_with_onnx_plan_equals_torch(exported, tmp_path):
    """`qtts say --plan` with the ONNX vocoder gives the torch audio (greedy, same codes)."""
    import soundfile as sf

    snap, main_r, first_r = exported[:3]
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "speech_decoder": {
                    "impl": "onnx",
                    "artifacts": {"main": main_r["path"], "first": first_r["path"]},
                }
            }
        )
    )
    ref = tmp_path / "ref.wav"
    sf.write(str(ref), (0.1 * np.sin(np.arange(24000) * 0.05)).astype(np.float32), 24000)
    common = [
        "say",
        "Hello there.",
        "-m",
        snap,
        "--ref-audio",
        str(ref),
        "--greedy",
        "--max-frames",
        "20",
        "--threads",
        "1",
    ]
    assert main([*common, "-o", str(tmp_path / "torch.wav")]) == 0
    assert main([*common, "--plan", str(plan), "-o", str(tmp_path / "onnx.wav")]) == 0
    a, _ = sf.read(str(tmp_path / "torch.wav"))
    b, _ = sf.read(str(tmp_path / "onnx.wav"))
    assert len(a) == len(b) > 0 and np.abs(a).max() > 0
    assert snr_db(a, b) >= 80.0
