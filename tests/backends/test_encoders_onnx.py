"""Both encoders export to ONNX with dynamic lengths and onnxruntime agrees with torch (tiny)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch

from qtts.audio import mel
from qtts.config import SpeakerEncoderConfig
from qtts.export.encoders import export_speaker_encoder, export_speech_encoder
from qtts.model.speaker import SpeakerEncoder
from support.encoder_helpers import TINY, codec_wav, official_tokenizer_pair


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_speaker_encoder_onnx_matches_torch(tmp_path):
    model = SpeakerEncoder(SpeakerEncoderConfig(**TINY)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    path = tmp_path / "speaker_encoder.onnx"
    info = export_speaker_encoder(model, str(path), frames=50)
    assert info["outputs"]["embedding"] == ["batch", TINY["enc_dim"]]
    sess = _session(path)
    for seconds in (1.0, 4.3):  # frame counts other than the traced 50
        m = mel.log_mel(codec_wav(seconds, 2))[None]
        with torch.no_grad():
            ref = model(torch.from_numpy(m)).numpy()
        got = sess.run(None, {"mel": m})[0]
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_speech_encoder_onnx_codes_equal_torch(tmp_path):
    _, model = official_tokenizer_pair()
    path = tmp_path / "speech_encoder.onnx"
    info = export_speech_encoder(model, str(path), seconds=2.0)
    assert info["samples_per_frame"] == 1920
    sess = _session(path)
    for seconds in (1.3, 5.1):  # not multiples of 1920 samples, other lengths than traced
        wav = codec_wav(seconds, 3)[None]
        with torch.no_grad():
            ref = model(torch.from_numpy(wav)).numpy()
        got = sess.run(None, {"wav": wav})[0]
        assert got.dtype == np.int64 and got.shape == ref.shape == (1, 16, -(-wav.shape[1] // 1920))
        assert (got == ref).mean() == 1.0
