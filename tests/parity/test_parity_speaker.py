"""Speaker-encoder front end and ECAPA-TDNN vs the official qwen-tts implementation (tiny, fp32)."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch

from qtts.audio import mel
from qtts.backends.torch import TorchSpeakerEncoder
from support.encoder_helpers import official_speaker_pair, speaker_wav

pytestmark = pytest.mark.parity

WAVS = {"short_1s": (1.0, 0, 0.0), "long_12s": (12.0, 1, 0.0), "silent_tail": (3.0, 2, 1.5)}


@pytest.fixture(scope="module")
def pair():
    return official_speaker_pair()


def official_mels(m, y: np.ndarray) -> torch.Tensor:
    """The official speaker-encoder input: log-mel [1, frames, 128] of 24 kHz ``y``."""
    with torch.no_grad():
        return m.mel_spectrogram(
            torch.from_numpy(y)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
            hop_size=256, win_size=1024, fmin=0, fmax=12000,
        ).transpose(1, 2)  # fmt: skip


@pytest.mark.parametrize("sr", [24000, 16000, 44100])
def test_slaney_filters_match_librosa(sr):
    fmax = min(12000, sr // 2)
    ref = librosa.filters.mel(sr=sr, n_fft=1024, n_mels=128, fmin=0, fmax=fmax)
    ours = mel.mel_filters(sr, 1024, 128, 0.0, float(fmax))
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("name", list(WAVS))
def test_log_mel_matches_official(pair, name):
    m, _, _ = pair
    y = speaker_wav(*WAVS[name])
    ref = official_mels(m, y)[0].numpy()
    ours = mel.log_mel(y)
    assert ours.shape == ref.shape == ((len(y) + 768 - 1024) // 256 + 1, 128)
    assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.parametrize("name", list(WAVS))
def test_speaker_embedding_matches_official(pair, name):
    m, ref_model, ours = pair
    y = speaker_wav(*WAVS[name])
    mels = official_mels(m, y)
    with torch.no_grad():
        ref = ref_model(mels)[0].numpy()
        same_input = ours(mels)[0].numpy()
    tol = 1e-4 * np.abs(ref).max()
    assert np.abs(same_input - ref).max() <= tol
    assert np.abs(TorchSpeakerEncoder(ours).embed(y) - ref).max() <= tol  # our numpy mel + our encoder


def test_speaker_encoder_batch_rows_independent(pair):
    _, _, ours = pair
    a, b = mel.log_mel(speaker_wav(2.0, 5)), mel.log_mel(speaker_wav(2.0, 6))
    with torch.no_grad():
        both = ours(torch.from_numpy(np.stack([a, b])))
        one = ours(torch.from_numpy(b)[None])
    torch.testing.assert_close(both[1:], one, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sr_in", [8000, 16000, 22050, 44100, 48000])
def test_resample_equals_librosa(sr_in):
    """Bit-identical to ``librosa.resample`` (soxr_hq + fix_length), what the official wrapper calls."""
    rng = np.random.default_rng(sr_in)
    for n in (sr_in, sr_in + 7, 3 * sr_in // 2 + 1):  # lengths that round the output size up
        t = np.arange(n) / sr_in
        tones = sum(0.2 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in (140, 1100, 3300))
        for y in (tones, 0.1 * rng.standard_normal(n)):
            y = y.astype(np.float32)
            ref = librosa.resample(y, orig_sr=sr_in, target_sr=24000)
            ours = mel.resample(y, sr_in, 24000)
            assert ours.dtype == np.float32
            np.testing.assert_array_equal(ours, ref)


def test_resample_identity_and_errors():
    y = np.linspace(-1, 1, 100, dtype=np.float32)
    np.testing.assert_array_equal(mel.resample(y, 24000, 24000), y)
    with pytest.raises(ValueError):
        mel.resample(y, 0, 24000)
    with pytest.raises(ValueError):
        mel.log_mel(np.zeros(100, np.float32))


def test_snapshot_embedding_equals_official_loader(tiny_snapshot, official_tts):
    """End to end through the loaders: official ``extract_speaker_embedding`` vs ``load_checkpoint``."""
    from qtts.weights import load_checkpoint

    path = tiny_snapshot("base", "0.6b")
    ref_model = official_tts(path).model
    ours = load_checkpoint(path, components=("speaker_encoder",)).model.speaker_encoder.eval()
    for name in ("short_1s", "silent_tail"):
        y = speaker_wav(*WAVS[name])
        ref = ref_model.extract_speaker_embedding(y, 24000).float().numpy()
        assert ref.shape == (ref_model.config.talker_config.hidden_size,)
        assert np.abs(TorchSpeakerEncoder(ours).embed(y) - ref).max() <= 1e-4 * np.abs(ref).max()


def test_embedding_from_16k_equals_official_librosa_path(pair):
    """Non-24 kHz input: the official wrapper resamples with librosa, we with mel.resample (same samples)."""
    m, ref_model, ours = pair
    y16 = librosa.resample(speaker_wav(3.0, 4), orig_sr=24000, target_sr=16000)
    ref_in = librosa.resample(y16, orig_sr=16000, target_sr=24000)
    ours_in = mel.resample(y16, 16000, 24000)
    np.testing.assert_array_equal(ours_in, ref_in)
    with torch.no_grad():
        ref = ref_model(official_mels(m, ref_in))[0].numpy()
    got = TorchSpeakerEncoder(ours).embed(ours_in)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
