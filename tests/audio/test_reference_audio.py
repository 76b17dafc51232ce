"""Reference audio is bounded before and while it is decoded: API and CLI (the server: tests/test_server_hardening.py).

Bombs (a 43 KB FLAC of 10 minutes, a FLAC whose header claims 2^36-1 samples) are refused from
the header without decoding; decoding reads at most MAX_SECONDS whatever the header says; odd
sample rates (whose resampling filter would be huge) and unknown lengths are refused.
"""

from __future__ import annotations

import resource

import numpy as np
import pytest
import soundfile as sf

from qtts.cli import main
from qtts.errors import InputError
from qtts.voice import MAX_SECONDS, ReferenceTooLong, load_reference_audio, probe_reference
from qtts.voice import reference as voice_mod
from support.hostile_audio import flac_claiming, square_flac, wav_8bit


def _write(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("name,data", [("ten_minutes.flac", lambda: square_flac(600)),
                                       ("claims_2^36.flac", lambda: flac_claiming((1 << 36) - 1)),
                                       ("31s.flac", lambda: square_flac(31)),
                                       ("five_minutes_8bit.wav", lambda: wav_8bit(300))])
def test_long_files_are_refused_from_the_header(tmp_path, name, data):
    path = _write(tmp_path, name, data())
    before = _peak_rss_mb()
    with pytest.raises(ReferenceTooLong, match=f"the limit is {MAX_SECONDS:.0f} s"):
        load_reference_audio(path)
    with pytest.raises(ReferenceTooLong):
        probe_reference(path)
    assert _peak_rss_mb() - before < 50  # nothing was decoded


def test_unknown_length_and_empty(tmp_path):
    with pytest.raises(InputError, match="does not state its length"):
        load_reference_audio(_write(tmp_path, "unknown.flac", flac_claiming(0)))
    empty = tmp_path / "empty.wav"
    sf.write(str(empty), np.zeros(0, np.float32), 24000)
    with pytest.raises(InputError, match="empty"):
        load_reference_audio(str(empty))


def test_a_header_that_understates_is_read_only_as_far_as_it_says(tmp_path):
    """A 10-minute FLAC whose header says 4 s decodes to 4 s (libsndfile stops where the header says)."""
    x = flac_claiming(4 * 24000, seconds=600)
    wav = load_reference_audio(_write(tmp_path, "under.flac", x))
    assert len(wav) == 4 * 24000


def test_decoding_is_bounded_in_frames(tmp_path, monkeypatch):
    """Whatever the header says, the decoder asks for at most MAX_SECONDS + 1 frame."""
    path = _write(tmp_path, "ok.flac", square_flac(4))
    asked = []
    real = voice_mod._read_blocks
    monkeypatch.setattr(voice_mod, "_read_blocks", lambda f, n: asked.append(n) or real(f, n))
    monkeypatch.setattr(voice_mod, "MAX_SECONDS", 2.0)
    with pytest.raises(ReferenceTooLong):  # the header says 4 s
        load_reference_audio(path)
    monkeypatch.setattr(voice_mod, "check_reference_header", lambda f, what: voice_mod.ReferenceInfo(
        "FLAC", f.samplerate, f.channels, f.frames))  # a header check that lets it through
    with pytest.raises(ReferenceTooLong, match="2.0 s long"):
        load_reference_audio(path)
    assert asked == [2 * 24000 + 1]


def test_blocks_mix_many_channels_to_mono(tmp_path):
    sr = 16000
    t = np.arange(2 * sr) / sr
    tone = 0.4 * np.sin(2 * np.pi * 300 * t)
    path = tmp_path / "eight.wav"
    sf.write(str(path), np.stack([tone] * 8, axis=1), sr)
    wav = load_reference_audio(str(path))
    assert wav.shape == (48000,) and abs(float(np.max(np.abs(wav))) - 0.4) < 0.01


@pytest.mark.parametrize("rate", [47999, 7999, 192001, 1_000_000])
def test_odd_sample_rates_are_refused(tmp_path, rate):
    path = tmp_path / "odd.wav"
    sf.write(str(path), np.zeros(rate // 100, np.float32) + 0.1, rate)
    with pytest.raises(InputError, match="unsupported sample rate"):
        load_reference_audio(str(path))
    with pytest.raises(InputError, match="unsupported sample rate"):
        load_reference_audio((np.full(rate, 0.1, np.float32), rate))


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 88200, 96000, 192000])
def test_common_sample_rates_are_read(rate):
    t = np.arange(int(1.5 * rate)) / rate
    wav = load_reference_audio(((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate))
    assert abs(len(wav) - 36000) <= 1


def test_arrays_longer_than_the_limit_are_refused():
    with pytest.raises(ReferenceTooLong):
        load_reference_audio(np.full(int((MAX_SECONDS + 1) * 24000), 0.1, np.float32))
    with pytest.raises(ReferenceTooLong):
        load_reference_audio((np.full(int((MAX_SECONDS + 1) * 8000), 0.1, np.float32), 8000))


def test_memory_error_and_decoder_errors_become_input_errors(tmp_path, monkeypatch):
    path = _write(tmp_path, "ok.flac", square_flac(3))

    def boom(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(sf.SoundFile, "read", boom)
    with pytest.raises(InputError, match="too large to decode"):
        load_reference_audio(path)

    def broken(*args, **kwargs):
        raise sf.LibsndfileError(1, "read failed: ")

    monkeypatch.setattr(sf.SoundFile, "read", broken)
    with pytest.raises(InputError, match="cannot read"):
        load_reference_audio(path)


def test_api_and_cli_refuse_a_bomb(real_tts, tiny_snapshot, tmp_path, capsys):
    bomb = _write(tmp_path, "bomb.flac", square_flac(600))
    with pytest.raises(ReferenceTooLong):
        real_tts.create_voice(bomb, ref_text="Never kept as an ICL prompt.")
    out = tmp_path / "bomb.voice"
    rc = main(["voice", "create", bomb, "--model", tiny_snapshot(), "--threads", "1", "-o", str(out)])
    assert rc == 2 and not out.exists()
    assert "limit is 30 s" in capsys.readouterr().err
