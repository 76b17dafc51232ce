"""The voice file: a cloned speaker as a small safetensors file (no pickle), parsed in one place.

A :class:`Voice` holds the x-vector (speaker-encoder output, ``[enc_dim]`` float32) and, for
in-context (ICL) cloning, the reference audio's codes ``[frames, 16]`` and its transcript.
The file stores the arrays as tensors ``speaker`` and ``ref_codes`` and everything else as
string metadata (``format``, model type/size, ``enc_dim``, ``sample_rate``, ``created``,
``qtts_version``, ``ref_text``, ``name``); :meth:`Voice.load` validates all of it.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..audio.codes import check_codes
from ..config import FRAME_RATE, SAMPLE_RATE
from ..errors import InputError
from ..files import atomic_path

log = logging.getLogger(__name__)

FORMAT = "qtts-voice-1"


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
            from ..version import __version__

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
        if not os.path.isfile(path):
            raise InputError(f"voice file '{path}' not found; create one with: qtts voice create REF.wav --model M -o {path}")
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise InputError(f"'{path}' is not a readable qtts voice file ({exc}); re-create it with qtts voice create") from exc
        return cls.from_bytes(data, path)

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> Voice:
        """A validated voice from the bytes of a voice file (``name`` in the errors): the one parser of the
        format, used by :meth:`load` and the voice folders (:mod:`qtts.voice.folder`)."""
        from safetensors import SafetensorError
        from safetensors.numpy import load

        try:
            (n,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + n])
            meta = dict(header.get("__metadata__") or {}) if isinstance(header, dict) else {}
            tensors = load(data)
        except (SafetensorError, struct.error, ValueError, TypeError) as exc:
            raise InputError(f"'{name}' is not a readable qtts voice file ({exc}); re-create it with qtts voice "
                             "create") from None
        return cls._from_parts(name, meta, tensors)

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
