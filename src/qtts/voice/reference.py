"""Reference audio for cloning: read, mix, resample and check it.

:func:`load_reference_audio` reads any format soundfile reads (wav, flac, ogg, mp3 with
libsndfile >= 1.1), mixes to mono, resamples to 24 kHz (:func:`qtts.audio.mel.resample`) and checks
the signal: shorter than 1 s, longer than 30 s (from the header, before decoding; decoding stops
there whatever the header says), an odd sample rate or silence is an error; over 20 s, clipped
or quiet is a warning. :func:`probe_reference` does the header checks alone.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import numpy as np

from ..config import SAMPLE_RATE
from ..errors import InputError

log = logging.getLogger(__name__)

MIN_SECONDS = 1.0
#: longest accepted reference (checked from the file header before decoding, and again while
#: decoding): an ICL voice replays its reference in every request, so long ones slow them all
MAX_SECONDS = 30.0
#: a reference longer than this works but logs a warning
LONG_SECONDS = 20.0
#: accepted sample rates of reference audio (see _check_rate)
MIN_RATE, MAX_RATE = 8000, 192000
_UNKNOWN_FRAMES = 1 << 62  # libsndfile reports SF_COUNT_MAX when the header has no length
_SILENT_RMS = 1e-4  # about -80 dBFS
_QUIET_PEAK = 0.02


@dataclass(frozen=True)
class ReferenceInfo:
    """What a reference file's header says (checked by :func:`probe_reference`)."""

    format: str  # libsndfile major format: WAV, FLAC, OGG, MP3, AIFF, ...
    sample_rate: int
    channels: int
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate


class ReferenceTooLong(InputError):
    """The reference audio is longer than :data:`MAX_SECONDS` (the server answers 413)."""


def load_reference_audio(src, sample_rate: int | None = None) -> np.ndarray:
    """Reference audio -> mono float32 at 24 kHz, checked (see the module docstring).

    ``src`` is a path (any format soundfile reads), a ``(samples, rate)`` tuple, or a numpy
    array at ``sample_rate`` (24 kHz when not given). Files are checked from their header
    first and decoded in blocks up to :data:`MAX_SECONDS`, whatever the header claims.
    """
    if isinstance(src, (str, os.PathLike)):
        wav, sr = _read_file(os.fspath(src))
    elif isinstance(src, tuple) and len(src) == 2:
        wav, sr = np.asarray(src[0]), src[1]
    else:
        wav, sr = np.asarray(src), sample_rate or SAMPLE_RATE
    sr = _check_rate(sr, "reference audio")
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim == 2:  # soundfile gives [frames, channels]
        wav = wav.mean(axis=1) if wav.shape[1] <= 8 else wav.mean(axis=0)
    if wav.ndim != 1 or wav.size == 0:
        raise InputError("reference audio is empty or not a mono/stereo signal")
    _check_length(len(wav) / sr, "reference audio")
    if not np.isfinite(wav).all():
        raise InputError("reference audio contains NaN or infinite samples")
    if sr != SAMPLE_RATE:
        from ..audio.mel import resample

        wav = resample(wav, sr, SAMPLE_RATE)
    check_reference(wav)
    return wav


def probe_reference(path: str) -> ReferenceInfo:
    """Header facts of a reference file, without decoding it (see :func:`check_reference_header`)."""
    import soundfile as sf

    if not os.path.isfile(path):
        raise InputError(f"reference audio '{path}' not found")
    try:
        info = sf.info(path)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise InputError(f"cannot read reference audio '{path}' ({_sf_reason(exc)}); use wav, flac, ogg or mp3") from None
    return check_reference_header(info, f"reference audio '{path}'")


def check_reference_header(info, what: str = "reference audio") -> ReferenceInfo:
    """Check what a header says (``info``: soundfile's ``info()`` or an open ``SoundFile``):
    empty, unknown length or an odd sample rate -> InputError; longer than MAX_SECONDS ->
    ReferenceTooLong. ``what`` names the file in messages."""
    rate = _check_rate(info.samplerate, what)
    channels, frames = int(info.channels), int(info.frames)
    if channels < 1 or frames <= 0:
        raise InputError(f"{what} is empty; send a clip of {MIN_SECONDS:.0f}-{MAX_SECONDS:.0f} s")
    if frames >= _UNKNOWN_FRAMES:
        raise InputError(f"{what} does not state its length in its header (a streamed file?); "
                         "save it again as a plain wav or flac file")
    _check_length(frames / rate, what)
    return ReferenceInfo(format=str(info.format), sample_rate=rate, channels=channels, frames=frames)


def _check_rate(rate, what: str) -> int:
    """The sample rate as an int, if it is one that resamples to 24 kHz cheaply.

    ``24000 / gcd`` is the resampler's phase count; keeping it <= 320 (11025 Hz and its
    multiples need 320) keeps its filter table small whatever rate a header claims.
    """
    try:
        rate = int(rate)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{what}: sample rate {rate!r} is not a number") from None
    if not MIN_RATE <= rate <= MAX_RATE or SAMPLE_RATE // math.gcd(rate, SAMPLE_RATE) > 320:
        raise InputError(f"{what} has an unsupported sample rate of {rate} Hz; use a common rate between "
                         f"{MIN_RATE} and {MAX_RATE} Hz (16000, 22050, 24000, 44100, 48000 ...)")
    return rate


def _check_length(seconds: float, what: str) -> None:
    if seconds > MAX_SECONDS:
        raise ReferenceTooLong(f"{what} is {seconds:.1f} s long; the limit is {MAX_SECONDS:.0f} s "
                               "(3-10 s works best): cut a shorter clip")


def _sf_reason(exc: Exception) -> str:
    """libsndfile's reason without the file name it prefixes (callers name the file once)."""
    return str(getattr(exc, "error_string", "") or exc)


def _read_file(path: str) -> tuple[np.ndarray, int]:
    """Decode a reference file to mono float32 at its own rate, bounded in frames and memory."""
    import soundfile as sf

    if not os.path.isfile(path):
        raise InputError(f"reference audio '{path}' not found")
    try:
        with sf.SoundFile(path) as f:
            info = check_reference_header(f, f"reference audio '{path}'")
            limit = int(MAX_SECONDS * info.sample_rate)
            wav = _read_blocks(f, min(info.frames, limit + 1))
    except InputError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise InputError(
            f"cannot read reference audio '{path}' ({_sf_reason(exc)}); use wav, flac, ogg or mp3"
        ) from None
    except MemoryError:
        raise InputError(f"reference audio '{path}' is too large to decode; cut a clip of 3-10 s") from None
    _check_length(len(wav) / info.sample_rate, f"reference audio '{path}'")
    return wav, info.sample_rate


def _read_blocks(f, max_frames: int) -> np.ndarray:
    """At most ``max_frames`` frames of ``f``, mixed to mono block by block (about 1 MiB each)."""
    block = max(1024, (1 << 18) // f.channels)
    pieces, total = [], 0
    while total < max_frames:
        data = f.read(min(block, max_frames - total), dtype="float32", always_2d=True)
        if len(data) == 0:
            break
        pieces.append(data[:, 0].copy() if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32))
        total += len(data)
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def check_reference(wav: np.ndarray) -> None:
    """Errors for unusable references, warnings for poor ones (24 kHz mono input)."""
    seconds = len(wav) / SAMPLE_RATE
    if seconds < MIN_SECONDS:
        raise InputError(f"reference audio is {seconds:.2f} s; at least {MIN_SECONDS:.0f} s is needed (3-10 s works best)")
    _check_length(seconds, "reference audio")
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))
    if rms < _SILENT_RMS:
        raise InputError("reference audio is silent; record or choose a clip with speech")
    if seconds > LONG_SECONDS:
        log.warning("reference audio is %.1f s; more than %.0f s slows every request (3-10 s works best)",
                    seconds, LONG_SECONDS)
    peak = float(np.max(np.abs(wav)))
    clipped = float(np.mean(np.abs(wav) >= 0.999))
    if clipped > 0.001:
        log.warning("reference audio is clipped (%.2f%% of samples at full scale); the clone may sound distorted",
                    100 * clipped)
    elif peak < _QUIET_PEAK:
        log.warning("reference audio is very quiet (peak %.4f); consider normalizing it", peak)


def add_trailing_silence(wav: np.ndarray, seconds: float) -> np.ndarray:
    """Append ``seconds`` of silence (the ICL anti-bleed trick: the model does not continue a phoneme)."""
    if seconds <= 0:
        return wav
    return np.concatenate([wav, np.zeros(int(round(seconds * SAMPLE_RATE)), dtype=np.float32)])
