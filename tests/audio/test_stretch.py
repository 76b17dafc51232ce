"""The streaming time stretch (``speed``): length, exact streaming, seamless joins, pitch kept."""

from __future__ import annotations

import numpy as np
import pytest

import qtts
from qtts.audio.stretch import TimeStretcher, check_speed, stretch
from qtts.errors import InputError

SR = 24000
SPEEDS = [0.25, 0.5, 0.8, 1.25, 2.0, 4.0]


def chirp(seconds: float = 1.5, f0: float = 120.0, f1: float = 300.0) -> np.ndarray:
    """A voiced-like test signal: a gliding fundamental with three harmonics."""
    t = np.arange(int(seconds * SR)) / SR
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * seconds))
    return (0.4 * np.sin(phase) + 0.2 * np.sin(2 * phase) + 0.1 * np.sin(3 * phase)).astype(np.float32)


def streamed(x: np.ndarray, speed: float, sizes) -> tuple[np.ndarray, list[int]]:
    """Push ``x`` in pieces of the given sizes (cycled); the output and its chunk boundaries."""
    st = TimeStretcher(speed, SR)
    parts, i, j = [], 0, 0
    while i < len(x):
        n = sizes[j % len(sizes)]
        parts.append(st.push(x[i : i + n]))
        i, j = i + n, j + 1
    parts.append(st.flush())
    bounds = np.cumsum([len(p) for p in parts])[:-1].tolist()
    return np.concatenate(parts), bounds


@pytest.mark.parametrize("speed", SPEEDS + [1.0])
@pytest.mark.parametrize("n", [0, 1, 100, 959, 960, 4000, 24000 + 7])
def test_output_length_is_input_over_speed(speed, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.1
    y = stretch(x, speed, SR)
    assert y.dtype == np.float32 and len(y) == int(np.floor(n / speed + 0.5))


@pytest.mark.parametrize("speed", SPEEDS)
def test_streamed_equals_offline_for_any_chunking(speed):
    x = chirp() + 0.01 * np.random.default_rng(1).standard_normal(int(1.5 * SR)).astype(np.float32)
    offline = stretch(x, speed, SR)
    rng = np.random.default_rng(int(speed * 100))
    for sizes in ([3840, 15360], [1], [7, 1000, 1920], rng.integers(1, 6000, size=50).tolist()):
        if sizes == [1] and speed not in (0.5, 2.0):
            continue  # one sample at a time: slow in numpy, two speeds are enough
        out, _ = streamed(x, speed, sizes)
        assert np.array_equal(out, offline), (speed, sizes[:4])


@pytest.mark.parametrize("speed", SPEEDS)
def test_no_discontinuity_at_chunk_joins(speed):
    """The largest sample-to-sample step at a chunk boundary is no larger than the signal's own
    steps, and nowhere in the output is a step larger than the input's largest (no clicks)."""
    x = chirp()
    out, bounds = streamed(x, speed, [3840, 15360, 5000])  # the engine's first chunk, then 8 frames
    steps = np.abs(np.diff(out))
    limit = np.abs(np.diff(x)).max()
    assert steps.max() <= 1.1 * limit, (steps.max(), limit)
    at_joins = np.array([steps[b - 1] for b in bounds if 0 < b < len(out)])
    assert len(at_joins) > 2 and at_joins.max() <= 1.1 * limit


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_pitch_and_level_are_kept(speed):
    t = np.arange(SR) / SR
    x = (0.5 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
    y = stretch(x, speed, SR)[2000:-2000]
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    peak_hz = np.argmax(spectrum) * SR / len(y)
    assert abs(peak_hz - 220.0) < 3.0, peak_hz
    # a stretched steady tone keeps its level everywhere (no window-rate amplitude ripple)
    frames = y[: len(y) // 480 * 480].reshape(-1, 480)
    rms = np.sqrt((frames**2).mean(axis=1))
    assert np.allclose(rms, 0.5 / np.sqrt(2), rtol=0.03), (rms.min(), rms.max())


def test_speed_one_is_untouched_and_bounds_checked():
    x = chirp(0.2)
    assert np.array_equal(stretch(x, 1.0, SR), x)
    for bad in (0.2, 4.5, float("nan"), "fast", None):
        with pytest.raises(InputError, match="speed"):
            check_speed(bad)
    with pytest.raises(InputError, match="speed"):
        qtts.SynthesisOptions(speed=5.0).validate()
    st = TimeStretcher(2.0, SR)
    st.flush()
    with pytest.raises(ValueError):
        st.push(x)


def test_engine_stream_with_speed_equals_offline_stretch(real_tts):
    """TTS.stream(speed=s) stretches while streaming: the chunks equal the offline stretch of the
    same (seeded) synthesis at speed 1, the final chunk reports the stretched duration."""
    opts = dict(seed=3, max_frames=20, first_chunk_frames=2, chunk_frames=4)
    voice = real_tts.create_voice(chirp(2.0), sample_rate=SR)
    plain = real_tts.synthesize("Stretch me.", voice=voice, options=qtts.SynthesisOptions(**opts))
    chunks = list(real_tts.stream("Stretch me.", voice=voice, options=qtts.SynthesisOptions(speed=1.5, **opts)))
    assert len(chunks) >= 3 and all(len(c.samples) for c in chunks[:-1])
    out = np.concatenate([c.samples for c in chunks])
    assert np.array_equal(out, stretch(plain.samples, 1.5, SR))
    final = chunks[-1]
    assert final.is_final and final.info["speed"] == 1.5
    assert final.info["audio_s"] == pytest.approx(len(out) / SR)
    assert len(out) == int(np.floor(len(plain.samples) / 1.5 + 0.5))


def test_qtts_say_speed(tiny_snapshot, tmp_path, capsys):
    """``qtts say --speed 2`` writes the offline stretch of the same seeded speed-1 audio."""
    import soundfile as sf

    from qtts.cli import main

    model = tiny_snapshot(kind="custom_voice")
    base = ["say", "Hello there.", "-m", model, "--speaker", "ryan", "--seed", "4", "--max-frames", "6",
            "--threads", "1", "-q"]
    assert main(base + ["-o", str(tmp_path / "plain.wav")]) == 0
    assert main(base + ["--speed", "2", "-o", str(tmp_path / "fast.wav")]) == 0
    plain, _ = sf.read(tmp_path / "plain.wav", dtype="float32")
    fast, rate = sf.read(tmp_path / "fast.wav", dtype="int16")
    assert rate == SR and len(fast) == int(np.floor(len(plain) / 2 + 0.5)) and len(plain) == 6 * 1920
    engine = qtts.load(model, threads=1)
    audio = engine.synthesize("Hello there.", speaker="ryan", options=qtts.SynthesisOptions(seed=4, max_frames=6))
    assert np.array_equal(fast, qtts.audio.float_to_int16(stretch(audio.samples, 2.0, SR)))
    capsys.readouterr()
    assert main(base + ["--speed", "5", "-o", str(tmp_path / "x.wav")]) == 2
    assert "--speed" in capsys.readouterr().err
