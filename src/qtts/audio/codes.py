"""Codec frames as files: ``qtts say --codes-out`` writes them, ``qtts decode`` vocodes them.

A codes array is what generation made, in order: ``[frames, 16]`` int64, one row per 80 ms frame
(codebook 0 from the talker first, then the predictor's 15), every code in ``[0, 2048)``; the
same array the official ``generate`` returns, so parity checks can compare it directly.

* ``.npy``: that array alone.
* ``.npz``: the array as ``codes``, plus ``prime`` for an ICL voice: the voice's reference codes,
  which the streaming vocoder decodes (and discards) before the first frame, exactly as
  :meth:`qtts.TTS.stream` does. With it the file alone reproduces the audio; an ``.npy`` of an ICL
  voice needs the voice again (``qtts decode --voice``, ``TTS.decode(codes, prime=voice.ref_codes)``).
  And ``codec``: the fingerprint of the speech tokenizer that made them (:attr:`qtts.TTS.codec`),
  so decoding with another checkpoint's vocoder is refused instead of making noise.

Files are written to a temporary name beside the target and renamed (umask permissions).
"""

from __future__ import annotations

import os
import zipfile
from typing import NamedTuple

import numpy as np

from ..config import CODEBOOK_SIZE, NUM_CODEBOOKS
from ..errors import InputError
from ..files import atomic_path

#: file suffixes a codes file may have (they pick the layout when writing)
CODES_SUFFIXES = (".npy", ".npz")
#: the arrays an .npz codes file may hold
NPZ_ARRAYS = ("codes", "prime", "codec")


class CodesFile(NamedTuple):
    """What a codes file holds: the frames, the ICL prime (or None), the codec fingerprint (or None)."""

    codes: np.ndarray
    prime: np.ndarray | None
    codec: str | None


def check_codes(array, what: str = "codes", codebook_size: int = CODEBOOK_SIZE,
                allow_empty: bool = False, num_codebooks: int = NUM_CODEBOOKS) -> np.ndarray:  # fmt: skip
    """``array`` as int64 ``[frames, num_codebooks]`` codes in ``[0, codebook_size)``, or an InputError
    naming the problem. The one check of codes, where they come in: files, ``TTS.decode`` and voices
    (a vocoder stream trusts what reaches it: these, or the engine's own frames)."""
    codes = np.asarray(array)
    if codes.ndim != 2 or codes.shape[1] != num_codebooks:
        raise InputError(f"{what}: expected codes of shape [frames, {num_codebooks}], got shape {codes.shape}")
    if codes.dtype.kind not in "iu":
        raise InputError(f"{what}: codes must be integers, got dtype {codes.dtype}")
    if not allow_empty and not len(codes):
        raise InputError(f"{what}: holds no frames (shape {codes.shape})")
    bad = np.argwhere((codes < 0) | (codes >= codebook_size))
    if len(bad):
        frame, book = (int(x) for x in bad[0])
        raise InputError(f"{what}: codes must be in [0, {codebook_size}); frame {frame} codebook {book} is "
                         f"{codes[frame, book]} ({len(bad)} such code{'s' if len(bad) > 1 else ''})")
    return codes.astype(np.int64)


def save_codes(path: str, codes, prime=None, codec: str | None = None) -> None:
    """Write ``codes`` (and, for ``.npz``, the ICL ``prime`` and ``codec``) atomically; the suffix picks the layout."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in CODES_SUFFIXES:
        raise InputError(f"{path}: a codes file ends in {' or '.join(CODES_SUFFIXES)}")
    arrays = {"codes": check_codes(codes, allow_empty=True)}
    if prime is not None and len(prime) and suffix == ".npz":
        arrays["prime"] = check_codes(prime, "prime")
    if codec:
        arrays["codec"] = np.array(str(codec))
    with atomic_path(path, suffix + ".part") as tmp, open(tmp, "wb") as fh:
        if suffix == ".npy":
            np.save(fh, arrays["codes"])
        else:
            np.savez(fh, **arrays)


#: what a file that is not a codes file most likely is, by its first bytes
_AUDIO_MAGIC = ((b"RIFF", "WAV audio"), (b"fLaC", "FLAC audio"), (b"OggS", "Ogg audio"), (b"ID3", "MP3 audio"))


def _check_magic(path: str) -> None:
    """Refuse a file that is neither .npy (``\\x93NUMPY``) nor .npz (a zip) by its first bytes,
    naming what it looks like (numpy's own message talks about pickles)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except (FileNotFoundError, IsADirectoryError):
        return  # np.load's handlers below name these
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    if head.startswith((b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06")):
        return
    kind = next((what for magic, what in _AUDIO_MAGIC if head.startswith(magic)), None)
    if kind is None and head[:2] and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        kind = "MP3 audio"
    what = f"it is {kind}, not codes" if kind else "it is not a .npy or .npz file"
    raise InputError(f"{path}: {what}; qtts decode takes codec frames saved by qtts say --codes-out (.npz) or an "
                     "integer [frames, 16] .npy (to speak a text, use qtts say)")


def load_codes(path: str, codebook_size: int = CODEBOOK_SIZE) -> CodesFile:
    """``(codes, prime, codec)`` from an ``.npy`` / ``.npz`` codes file (None where it has none)."""
    _check_magic(path)
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory; give a .npy or .npz codes file") from None
    except ValueError as exc:
        if "pickle" in str(exc):
            raise InputError(f"{path}: holds Python objects, not integer codes; save the codes as an integer "
                             "[frames, 16] array (np.save) or with qtts say --codes-out") from None
        raise InputError(f"{path}: not a readable .npy or .npz codes file ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a readable .npy or .npz codes file ({exc})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        return CodesFile(check_codes(data, path, codebook_size), None, None)
    with data:
        unknown = sorted(set(data.files) - set(NPZ_ARRAYS))
        if "codes" not in data.files or unknown:
            raise InputError(f"{path}: an .npz codes file holds 'codes' and optionally 'prime', 'codec'; "
                             f"this one holds {', '.join(data.files) or 'nothing'}")
        try:
            codes, prime = data["codes"], data["prime"] if "prime" in data.files else None
            codec = data["codec"] if "codec" in data.files else None
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise InputError(f"{path}: cannot read its arrays ({exc})") from None
    codes = check_codes(codes, path, codebook_size)
    if prime is not None:
        prime = check_codes(prime, f"{path}: prime", codebook_size, allow_empty=True)
    if codec is not None and (codec.ndim or codec.dtype.kind != "U"):
        raise InputError(f"{path}: 'codec' must be one string (the speech tokenizer fingerprint), "
                         f"got {codec.dtype} of shape {codec.shape}")
    return CodesFile(codes, prime if prime is not None and len(prime) else None,
                     None if codec is None else str(codec))
