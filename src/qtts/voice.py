"""Voices: a cloned speaker as a small safetensors file (no pickle).

A :class:`Voice` holds the x-vector (speaker-encoder output, ``[enc_dim]`` float32) and, for
in-context (ICL) cloning, the reference audio's codes ``[frames, 16]`` and its transcript.
The file stores the arrays as tensors ``speaker`` and ``ref_codes`` and everything else as
string metadata (``format``, model type/size, ``enc_dim``, ``sample_rate``, ``created``,
``qtts_version``, ``ref_text``, ``name``); :meth:`Voice.load` validates all of it.

:func:`load_reference_audio` reads any format soundfile reads (wav, flac, ogg, mp3 with
libsndfile >= 1.1), mixes to mono, resamples to 24 kHz (:func:`qtts.mel.resample`) and checks
the signal: too short or silent is an error; too long, clipped or quiet is a warning.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .files import atomic_path

log = logging.getLogger(__name__)

FORMAT = "qtts-voice-1"
SAMPLE_RATE = 24000
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
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
        if self.ref_codes is not None:
            self.ref_codes = np.asarray(self.ref_codes, dtype=np.int64)
        if not self.qtts_version:
            from . import __version__

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
        if codes is not None and (codes.ndim != 2 or codes.shape[1] != 16 or codes.min(initial=0) < 0
                                  or codes.max(initial=0) > 2047):
            raise InputError(f"'{path}': reference codes must be [frames, 16] in 0..2047; re-create the voice")
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
            "reference": (f"{len(self.ref_codes)} frames = {len(self.ref_codes) / 12.5:.2f} s"
                          if self.ref_codes is not None else "-"),
            "reference text": self.ref_text or "-",
            "created": self.created,
            "qtts version": self.qtts_version,
        }


def load_reference_audio(src, sample_rate: int | None = None) -> np.ndarray:
    """Reference audio -> mono float32 at 24 kHz, checked (see the module docstring).

    ``src`` is a path (any format soundfile reads), a ``(samples, rate)`` tuple, or a numpy
    array at ``sample_rate`` (24 kHz when not given).
    """
    if isinstance(src, (str, os.PathLike)):
        wav, sr = _read_file(os.fspath(src))
    elif isinstance(src, tuple) and len(src) == 2:
        wav, sr = np.asarray(src[0]), int(src[1])
    else:
        wav, sr = np.asarray(src), int(sample_rate or SAMPLE_RATE)
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim == 2:  # soundfile gives [frames, channels]
        wav = wav.mean(axis=1) if wav.shape[1] <= 8 else wav.mean(axis=0)
    if wav.ndim != 1 or wav.size == 0:
        raise InputError("reference audio is empty or not a mono/stereo signal")
    if not np.isfinite(wav).all():
        raise InputError("reference audio contains NaN or infinite samples")
    if sr != SAMPLE_RATE:
        from .mel import resample

        wav = resample(wav, sr, SAMPLE_RATE)
    check_reference(wav)
    return wav


def _read_file(path: str) -> tuple[np.ndarray, int]:
    import soundfile as sf

    if not os.path.isfile(path):
        raise InputError(f"reference audio '{path}' not found")
    try:
        wav, sr = sf.read(path, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise InputError(
            f"cannot read reference audio '{path}' ({exc}); use wav, flac or ogg (mp3 needs libsndfile >= 1.1)"
        ) from exc
    return wav, int(sr)


def check_reference(wav: np.ndarray) -> None:
    """Errors for unusable references, warnings for poor ones (24 kHz mono input)."""
    seconds = len(wav) / SAMPLE_RATE
    if seconds < MIN_SECONDS:
        raise InputError(f"reference audio is {seconds:.2f} s; at least {MIN_SECONDS:.0f} s is needed (3-10 s works best)")
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))
    if rms < _SILENT_RMS:
        raise InputError("reference audio is silent; record or choose a clip with speech")
    if seconds > MAX_SECONDS:
        log.warning("reference audio is %.1f s; more than %.0f s slows every request (3-10 s works best)",
                    seconds, MAX_SECONDS)
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
