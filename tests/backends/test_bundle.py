"""Bundles: the checkpoint fingerprint check, fresh atomic exports, a quiet exporter, old bundles,
and the default thread count."""

from __future__ import annotations

import json
import logging
import os
import warnings

import pytest

from conftest import reference_configs
from qtts.cli import main as qtts_main
from qtts.errors import InputError
from qtts.export.onnx import ExportOptions, export_bundle
from qtts.plans.plan import fingerprint

NOTHING = ExportOptions(components=())  # manifest + plan only: what the checks read


def _listing(path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_fingerprint_tells_checkpoints_apart(tiny_snapshot):
    a, b = tiny_snapshot(kind="custom_voice"), tiny_snapshot(kind="custom_voice", seed=1)
    assert fingerprint(a) == fingerprint(a)
    assert fingerprint(a) != fingerprint(b)  # same configs and layout: only the sampled weights differ


def test_plan_from_another_checkpoint_is_refused(tiny_snapshot, tmp_path, capsys):
    import qtts

    source, other = tiny_snapshot(kind="custom_voice"), tiny_snapshot(kind="custom_voice", seed=1)
    export_bundle(source, str(tmp_path / "b"), NOTHING)
    plan = str(tmp_path / "b" / "plan.json")
    with pytest.raises(InputError, match="exported from another checkpoint") as err:
        qtts.load(other, plan=plan)
    assert source in str(err.value) and other in str(err.value)
    argv = ["say", "Hi.", "--model", other, "--plan", plan, "--speaker", "vivian", "-o", str(tmp_path / "x.wav")]
    assert qtts_main(argv) == 2
    stderr = capsys.readouterr().err
    assert source in stderr and other in stderr and not (tmp_path / "x.wav").exists()
    assert qtts.load(source, plan=plan, threads=1).components.plan.path == plan  # its own checkpoint loads


def test_export_refuses_an_existing_bundle_unless_overwrite(tiny_snapshot, tmp_path):
    snapshot = tiny_snapshot(kind="custom_voice")
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "talker.int8.onnx").write_bytes(b"stale file of an int8 export")
    with pytest.raises(InputError, match="--force"):
        export_bundle(snapshot, str(out), NOTHING)
    assert (out / "talker.int8.onnx").exists()  # refused: nothing touched
    export_bundle(snapshot, str(out), NOTHING, overwrite=True)
    assert sorted(_listing(out)) == ["manifest.json", "plan.json"]  # a fresh bundle, no stale files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no temporary directories left


def test_failed_export_leaves_the_target_as_it_was(tiny_snapshot, tmp_path):
    snapshot = tiny_snapshot(kind="custom_voice")
    out = tmp_path / "bundle"
    export_bundle(snapshot, str(out), NOTHING)
    before = _listing(out)
    broken = ExportOptions(components=(), vocoder_from=str(tmp_path / "no-such-bundle"))
    with pytest.raises(InputError, match="plan file not found"):
        export_bundle(snapshot, str(out), broken, overwrite=True)
    assert _listing(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


@pytest.fixture(scope="module")
def old_bundle(tiny_snapshot, tmp_path_factory):
    """A bundle as older qtts wrote it: legacy component names, no checkpoint fingerprint."""
    from qtts.export.vocoder import export_vocoder_onnx

    out = tmp_path_factory.mktemp("old-bundle")
    export_vocoder_onnx(tiny_snapshot(kind="custom_voice"), 2, str(out / "speech_decoder.b2.onnx"))
    plan = {"speech_decoder": {"impl": "onnx", "artifacts": {"main": "speech_decoder.b2.onnx"}, "precision": "fp32"}}
    manifest = {"precision": {"speech_decoder": "fp32"}, "source": {"checkpoint_sha256": {}}, "graphs": {}}
    for name, data in (("plan.json", plan), ("manifest.json", manifest)):
        (out / name).write_text(json.dumps(data))
    return out


def test_old_bundle_loads_with_a_warning(tiny_snapshot, old_bundle, caplog):
    from qtts.backends import open as open_components
    from qtts.backends.onnx import OnnxVocoder
    from qtts.plans.plan import read_manifest

    with caplog.at_level(logging.WARNING, logger="qtts.plans.plan"):
        parts = open_components(tiny_snapshot(kind="custom_voice"), plan=str(old_bundle / "plan.json"))
    assert "records no checkpoint fingerprint" in caplog.text
    assert isinstance(parts.vocoder, OnnxVocoder) and parts.plan.impl("vocoder") == "onnx"
    assert read_manifest(str(old_bundle))["precision"] == {"vocoder": "fp32"}


def test_exporter_warnings_stay_in_the_log(tiny_snapshot, tmp_path, capfd, caplog):
    """The tracer's warnings (int(shape) constants, the legacy-exporter notice) and torch's C++
    'custom opset not used' notice never reach the user; the Python ones are logged at debug."""
    from qtts.export.onnx import export_text_projection
    from qtts.export.vocoder import export_vocoder_onnx
    from qtts.weights import load_checkpoint

    snapshot = tiny_snapshot(kind="custom_voice")
    talker = load_checkpoint(snapshot, components=("talker",)).model.talker
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.DEBUG, logger="qtts.export.write"):
        warnings.simplefilter("always")
        export_vocoder_onnx(snapshot, 2, str(tmp_path / "voc2.onnx"))
        export_text_projection(talker, str(tmp_path / "text_projection.onnx"))
    assert [str(w.message) for w in seen] == []
    assert "TracerWarning" in caplog.text
    captured = capfd.readouterr()
    assert "Warning" not in captured.err and "Warning" not in captured.out


def test_default_threads_by_model_size(tiny_snapshot):
    from qtts.backends import MAX_THREADS, default_threads
    from qtts.config import ModelConfig

    assert default_threads(ModelConfig.from_dir(tiny_snapshot(), speech_tokenizer=False)) == 1
    real = ModelConfig.from_dir(reference_configs("Qwen3-TTS-12Hz-0.6B-Base"),
                                speech_tokenizer=False)  # fmt: skip
    assert default_threads(real) == max(1, min(os.cpu_count() or 1, MAX_THREADS))
