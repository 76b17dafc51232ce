"""One weight file for all vocoder step sizes of a bundle (export.vocoder.share_step_weights,
backends.onnx.SharedWeights), older bundles without it, and encoders built on first use."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from support.vocoder_fixtures import feed


@pytest.fixture(scope="module")
def vocoder_bundle(tiny_bundle):
    return tiny_bundle("base", "--components", "vocoder")  # shared with tests/audio/test_codes.py


def _codes(frames: int = 24) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 2048, (frames, 16))


def _decode(vocoder, codes, chunks=(1, 2, 4, 8)) -> np.ndarray:
    return feed(vocoder.stream(), codes, list(chunks))


def test_export_writes_one_weight_file_for_both_steps(vocoder_bundle):
    from qtts.export.vocoder import SHARED_DATA, SHARED_INDEX

    with open(os.path.join(vocoder_bundle, "plan.json"), encoding="utf-8") as fh:
        arts = json.load(fh)["vocoder"]["artifacts"]
    # the 1-frame first step by default
    assert arts == {"first": "vocoder.b1.onnx", "main": "vocoder.b8.onnx"}
    with open(os.path.join(vocoder_bundle, SHARED_INDEX), encoding="utf-8") as fh:
        index = json.load(fh)
    assert sorted(index["graphs"]) == ["vocoder.b1.onnx", "vocoder.b8.onnx"]
    b1, b8 = (set(index["graphs"][n].values()) for n in ("vocoder.b1.onnx", "vocoder.b8.onnx"))
    assert len(b1 & b8) >= 0.9 * len(b8)  # the weights are the same tensors, stored once
    offsets = [t["offset"] for t in index["tensors"].values()]
    assert len(set(offsets)) == len(offsets) and all(o % 4096 == 0 for o in offsets)
    end = max(t["offset"] + t["length"] for t in index["tensors"].values())
    assert os.path.getsize(os.path.join(vocoder_bundle, SHARED_DATA)) == end
    for name in index["graphs"]:  # the graphs themselves hold no weights any more
        assert os.path.getsize(os.path.join(vocoder_bundle, name)) < os.path.getsize(
            os.path.join(vocoder_bundle, SHARED_DATA))  # fmt: skip


def test_shared_weights_decode_like_a_self_contained_step(vocoder_bundle, tiny_snapshot, tmp_path):
    from qtts.backends.onnx import OnnxVocoder
    from qtts.export.vocoder import export_vocoder_onnx, verify_onnx

    main, first = (os.path.join(vocoder_bundle, f"vocoder.b{b}.onnx") for b in (8, 1))
    shared = OnnxVocoder(main, first, threads=1)
    assert shared.shared is not None and shared.shared.values
    inline = [str(tmp_path / f"b{b}.onnx") for b in (8, 1)]
    for path, b in zip(inline, (8, 1)):
        export_vocoder_onnx(tiny_snapshot(), b, path)  # one file, weights inside
    plain = OnnxVocoder(*inline, threads=1)
    assert plain.shared is None
    codes = _codes()
    np.testing.assert_allclose(_decode(shared, codes), _decode(plain, codes), atol=1e-5, rtol=0)
    assert verify_onnx(tiny_snapshot(), main, first, frames=40, chunks=[1, 2, 4, 8]) >= 80.0


def test_bundle_without_the_index_still_loads(vocoder_bundle, tmp_path):
    """A bundle exported before the index existed (or a copied step) loads each graph's weights itself."""
    from qtts.backends.onnx import OnnxVocoder
    from qtts.export.vocoder import SHARED_INDEX

    old = str(tmp_path / "old")
    shutil.copytree(vocoder_bundle, old)
    os.remove(os.path.join(old, SHARED_INDEX))
    main, first = (os.path.join(old, f"vocoder.b{b}.onnx") for b in (8, 1))
    legacy = OnnxVocoder(main, first, threads=1)
    assert legacy.shared is None
    new = OnnxVocoder(*(os.path.join(vocoder_bundle, f"vocoder.b{b}.onnx") for b in (8, 1)), threads=1)
    codes = _codes()
    np.testing.assert_allclose(_decode(legacy, codes), _decode(new, codes), atol=1e-5, rtol=0)


def test_encoders_are_built_on_first_use(tiny_snapshot):
    from qtts.backends import LazyPart
    from qtts.backends import open as open_components

    parts = open_components(tiny_snapshot(), threads=1)
    assert isinstance(parts.speaker_encoder, LazyPart) and parts.speaker_encoder._part is None
    assert parts.speech_encoder._part is None
    wav = np.sin(np.arange(24000, dtype=np.float32) / 20.0) * 0.3
    vec = parts.speaker_encoder.embed(wav)
    assert parts.speaker_encoder._part is not None and vec.shape == (parts.config.speaker_encoder.enc_dim,)
    assert parts.speech_encoder._part is None  # each part on its own


def test_lazy_part_refuses_unknown_private_attributes():
    from qtts.backends import LazyPart

    lazy = LazyPart.__new__(LazyPart)  # as copy/pickle make it: no __init__
    with pytest.raises(AttributeError):
        lazy._part  # noqa: B018
