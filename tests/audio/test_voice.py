"""Voice files (safetensors + metadata) and reference-audio loading."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import soundfile as sf

from qtts.errors import InputError
from qtts.voice import Voice, add_trailing_silence, load_reference_audio


def _voice(icl=True, dim=32):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2048, (20, 16)) if icl else None
    return Voice(rng.standard_normal(dim), ref_codes=codes, ref_text="Hello there." if icl else None,
                 model_size="0b6", name="me")


def _tone(sr, seconds=2.0, hz=440.0, amp=0.5):
    t = np.arange(int(sr * seconds)) / sr
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.float32)


@pytest.mark.parametrize("icl", [True, False])
def test_round_trip(tmp_path, icl):
    v = _voice(icl)
    path = tmp_path / "me.voice"
    v.save(str(path))
    w = Voice.load(str(path))
    np.testing.assert_array_equal(w.speaker, v.speaker)
    assert w.icl == icl and w.ref_text == v.ref_text and w.model_size == "0b6" and w.name == "me"
    if icl:
        np.testing.assert_array_equal(w.ref_codes, v.ref_codes)
    assert w.describe()["mode"].startswith("ICL" if icl else "x-vector")
    assert not list(tmp_path.glob(".qtts-*"))  # no temp file left behind


def test_no_pickle_in_file(tmp_path):
    path = tmp_path / "v.voice"
    _voice().save(str(path))
    head = path.read_bytes()[:8]
    assert int.from_bytes(head, "little") < 10_000  # a safetensors JSON header length, not a pickle


@pytest.mark.parametrize("damage", ["garbage", "truncate", "empty"])
def test_corrupt_file(tmp_path, damage):
    path = tmp_path / "v.voice"
    _voice().save(str(path))
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not a voice at all" * 10, "truncate": data[: len(data) // 2], "empty": b""}[damage])
    with pytest.raises(InputError, match="voice"):
        Voice.load(str(path))


def test_foreign_safetensors_rejected(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "x.safetensors"
    save_file({"speaker": np.zeros(4, np.float32)}, str(path))
    with pytest.raises(InputError, match="not a qtts voice"):
        Voice.load(str(path))


def test_missing_file_says_how_to_create():
    with pytest.raises(InputError, match="qtts voice create"):
        Voice.load("/nonexistent/me.voice")


def test_mismatched_model():
    v = _voice(dim=32)
    v.check_compatible("base", "0b6", 32)
    with pytest.raises(InputError, match="needs 64"):
        v.check_compatible("base", "0b6", 64)
    with pytest.raises(InputError, match="1b7"):
        v.check_compatible("base", "1b7", 32)
    with pytest.raises(InputError, match="Base"):
        v.check_compatible("custom_voice", "0b6", 32)


@pytest.mark.parametrize("sr", [16000, 44100, 48000])
def test_resampled_to_24k(tmp_path, sr):
    path = tmp_path / f"ref{sr}.wav"
    sf.write(str(path), _tone(sr), sr)
    wav = load_reference_audio(str(path))
    assert wav.dtype == np.float32 and abs(len(wav) - 48000) <= 1
    spectrum = np.abs(np.fft.rfft(wav[2400:-2400]))
    peak_hz = np.argmax(spectrum) * 24000 / len(wav[2400:-2400])
    assert abs(peak_hz - 440.0) < 2.0


@pytest.mark.parametrize("fmt", ["FLAC", "OGG", "MP3"])
def test_reads_flac_ogg_mp3(tmp_path, fmt):
    path = tmp_path / f"ref.{fmt.lower()}"
    stereo = np.stack([_tone(48000), _tone(48000)], axis=1)
    sf.write(str(path), stereo, 48000, format=fmt)
    wav = load_reference_audio(str(path))
    assert wav.ndim == 1 and abs(len(wav) - 48000) <= 1


def test_array_inputs():
    assert len(load_reference_audio((_tone(16000), 16000))) == 48000
    assert len(load_reference_audio(_tone(24000))) == 48000


@pytest.mark.parametrize(
    "wav,match",
    [
        (np.zeros(0, np.float32), "empty"),
        (_tone(24000, seconds=0.5), "at least"),
        (np.zeros(48000, np.float32), "silent"),
        (np.full(48000, np.nan, np.float32), "NaN"),
    ],
)
def test_bad_references(wav, match):
    with pytest.raises(InputError, match=match):
        load_reference_audio((wav, 24000))


def test_unreadable_file(tmp_path):
    path = tmp_path / "ref.wav"
    path.write_bytes(b"RIFF....nonsense")
    with pytest.raises(InputError, match="cannot read"):
        load_reference_audio(str(path))


def test_warnings_for_clipped_and_long(caplog):
    with caplog.at_level(logging.WARNING, logger="qtts.voice"):
        load_reference_audio((np.clip(_tone(24000, amp=3.0), -1, 1), 24000))
        load_reference_audio((_tone(24000, seconds=21.0), 24000))
    text = caplog.text
    assert "clipped" in text and "21.0 s" in text


def test_trailing_silence():
    wav = _tone(24000)
    out = add_trailing_silence(wav, 0.5)
    assert len(out) == len(wav) + 12000 and not out[-12000:].any()
    assert add_trailing_silence(wav, 0.0) is wav
