"""Voices: a cloned speaker as a small safetensors file (no pickle).

A :class:`Voice` holds the x-vector (speaker-encoder output, ``[enc_dim]`` float32) and, for
in-context (ICL) cloning, the reference audio's codes ``[frames, 16]`` and its transcript.
The file stores the arrays as tensors ``speaker`` and ``ref_codes`` and everything else as
string metadata (``format``, model type/size, ``enc_dim``, ``sample_rate``, ``created``,
``qtts_version``, ``ref_text``, ``name``); :meth:`Voice.load` validates all of it.

:func:`load_reference_audio` reads any format soundfile reads (wav, flac, ogg, mp3 with
libsndfile >= 1.1), mixes to mono, resamples to 24 kHz (:func:`qtts.audio.mel.resample`) and checks
the signal: shorter than 1 s, longer than 30 s (from the header, before decoding; decoding stops
there whatever the header says), an odd sample rate or silence is an error; over 20 s, clipped
or quiet is a warning. :func:`probe_reference` does the header checks alone.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
from dataclasses import dataclass, field

import numpy as np

from .audio.codes import check_codes
from .config import FRAME_RATE, SAMPLE_RATE
from .errors import InputError
from .files import atomic_path

log = logging.getLogger(__name__)

FORMAT = "qtts-voice-1"
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


@dataclass
class Voice:
    """A cloned voice: x-vector, optional ICL reference (codes + transcript), provenance."""

    speaker: np.ndarray
    ref_codes: np.ndarray | None = None
    ref_text: str | None = None
    model_type: str = "base"
    model_size: str = ""
    name: str = ""
    sample_rate: int = SAMPLE_RATE
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    qtts_version: str = ""

    def __post_init__(self):
        self.speaker = np.asarray(self.speaker, dtype=np.float32).reshape(-1)
        if self.ref_codes is not None:  # checked where a request takes the voice (text.prompt.resolve_mode)
            self.ref_codes = np.asarray(self.ref_codes, dtype=np.int64)
        if not self.qtts_version:
            from .version import __version__

            self.qtts_version = __version__

    @property
    def enc_dim(self) -> int:
        return int(self.speaker.shape[0])

    @property
    def icl(self) -> bool:
        """True when the voice carries reference codes and transcript (in-context cloning)."""
        return self.ref_codes is not None and bool(self.ref_text)

    def check_compatible(self, model_type: str, model_size: str, hidden_size: int) -> None:
        """Raise InputError unless this voice can condition the given checkpoint."""
        if model_type != "base":
            raise InputError(
                f"voices clone speakers on Base checkpoints; this model is '{model_type}' "
                "(use --speaker for CustomVoice, --instruct for VoiceDesign)"
            )
        if self.enc_dim != hidden_size:
            raise InputError(
                f"voice has a {self.enc_dim}-dim speaker vector but the model needs {hidden_size} "
                f"(voice made for model size '{self.model_size}'); create the voice with this model"
            )
        if self.model_size and model_size and self.model_size != model_size:
            raise InputError(
                f"voice was made for model size '{self.model_size}', this model is '{model_size}'; "
                "create the voice with this model"
            )

    def save(self, path: str) -> None:
        """Write the voice atomically (temp file in the target directory, then rename; umask honoured)."""
        from safetensors.numpy import save_file

        tensors = {"speaker": self.speaker}
        if self.ref_codes is not None:
            tensors["ref_codes"] = np.ascontiguousarray(self.ref_codes, dtype=np.int64)
        meta = {
            "format": FORMAT,
            "model_type": self.model_type,
            "model_size": self.model_size,
            "enc_dim": str(self.enc_dim),
            "sample_rate": str(self.sample_rate),
            "created": self.created,
            "qtts_version": self.qtts_version,
            "name": self.name,
        }
        if self.ref_text:
            meta["ref_text"] = self.ref_text
        with atomic_path(path, ".voice.part") as tmp:
            save_file(tensors, tmp, metadata=meta)

    @classmethod
    def load(cls, path: str) -> Voice:
        """Read and validate a voice file; any defect is an InputError naming it."""
        from safetensors import SafetensorError, safe_open

        if not os.path.isfile(path):
            raise InputError(f"voice file '{path}' not found; create one with: qtts voice create REF.wav --model M -o {path}")
        try:
            with safe_open(path, framework="numpy") as fh:
                meta = dict(fh.metadata() or {})
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputError(f"'{path}' is not a readable qtts voice file ({exc}); re-create it with qtts voice create") from exc
        return cls._from_parts(path, meta, tensors)

    @classmethod
    def _from_parts(cls, path: str, meta: dict, tensors: dict) -> Voice:
        if meta.get("format") != FORMAT:
            raise InputError(f"'{path}' is not a qtts voice file (format {meta.get('format')!r}, expected {FORMAT!r})")
        spk = tensors.get("speaker")
        if spk is None or spk.ndim != 1 or spk.dtype != np.float32 or not np.isfinite(spk).all():
            raise InputError(f"'{path}': the speaker vector is missing or malformed; re-create the voice")
        if str(spk.shape[0]) != meta.get("enc_dim"):
            raise InputError(f"'{path}': speaker vector has {spk.shape[0]} dims but the file says {meta.get('enc_dim')}")
        codes = tensors.get("ref_codes")
        if codes is not None:
            codes = check_codes(codes, f"'{path}': reference codes (re-create the voice)", allow_empty=True)
        try:
            sample_rate = int(meta.get("sample_rate", SAMPLE_RATE))
        except ValueError as exc:
            raise InputError(f"'{path}': bad sample_rate metadata") from exc
        return cls(
            speaker=spk, ref_codes=codes, ref_text=meta.get("ref_text") or None,
            model_type=meta.get("model_type", "base"), model_size=meta.get("model_size", ""),
            name=meta.get("name", ""), sample_rate=sample_rate,
            created=meta.get("created", ""), qtts_version=meta.get("qtts_version", "?"),
        )

    def describe(self) -> dict:
        """Plain facts for `qtts voice show`."""
        return {
            "name": self.name or "-",
            "model": f"{self.model_type} {self.model_size}".strip(),
            "speaker vector": f"{self.enc_dim} dims, norm {float(np.linalg.norm(self.speaker)):.3f}",
            "mode": "ICL (reference codes + text)" if self.icl else "x-vector only",
            "reference": (f"{len(self.ref_codes)} frames = {len(self.ref_codes) / FRAME_RATE:.2f} s"
                          if self.ref_codes is not None else "-"),
            "reference text": self.ref_text or "-",
            "created": self.created,
            "qtts version": self.qtts_version,
        }


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
        from .audio.mel import resample

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
