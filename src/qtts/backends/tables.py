"""Gathered embedding tables of a bundle (``tables/*.npy``): one file format, written and read here.

The text embedding (151936 x 2048 at full size), the talker's codec embedding and the predictor's
15 codec embeddings are only *gathered*: a generation reads a few rows of them. They are stored as
memory-mapped ``.npy`` files in one of :data:`STORAGES`:

* ``fp32`` / ``fp16``: the rows as they are (fp16 halves the file; rows are cast to fp32 when read);
* ``int8``: symmetric int8 with one fp32 scale per row, in ``NAME.npy`` (int8) and
  ``NAME.scale.npy`` (fp32, the table's shape without its last axis); a row reads back as
  ``int8 * scale``. Per-row absmax scaling of a Gaussian row of 2048 values keeps ~42 dB of row SNR,
  far above what the weight quantization of the graphs costs (docs/fidelity.md has the gate).

:func:`load_table` finds the storage from the file itself (an int8 ``.npy`` has its scales beside
it), so a bundle's manifest names one path per table whatever its storage.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import InputError
from ..files import atomic_path

STORAGES = ("fp32", "fp16", "int8")
SCALE_SUFFIX = ".scale.npy"


class QuantTable:
    """An int8 table with per-row scales; indexing the leading axes gives fp32 rows."""

    def __init__(self, data: np.ndarray, scale: np.ndarray):
        if data.shape[:-1] != scale.shape:
            raise InputError(f"int8 table of shape {data.shape} has scales of shape {scale.shape}; re-export the bundle")
        self.data, self.scale = data, scale

    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def dtype(self):
        return np.dtype(np.float32)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx):
        if isinstance(idx, (int, np.integer)) and self.data.ndim > 2:
            return QuantTable(self.data[idx], self.scale[idx])  # one table of a stacked set
        rows, scale = self.data[idx], self.scale[idx]
        return rows.astype(np.float32) * np.asarray(scale, dtype=np.float32)[..., None]

    def __array__(self, dtype=None, copy=None):
        out = self.data.astype(np.float32) * np.asarray(self.scale, dtype=np.float32)[..., None]
        return out if dtype is None else out.astype(dtype, copy=False)


def quantize_rows(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: ``(int8 data, fp32 scales)`` with ``data * scale ~= arr``."""
    arr = np.asarray(arr, dtype=np.float32)
    absmax = np.abs(arr).max(axis=-1)
    scale = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    data = np.clip(np.rint(arr / scale[..., None]), -127, 127).astype(np.int8)
    return data, scale


def save_table(path: str, arr: np.ndarray, storage: str) -> None:
    """Write ``arr`` to ``path`` (``.npy``) in ``storage``, atomically (scales first for int8)."""
    if storage not in STORAGES:
        raise InputError(f"unknown table storage '{storage}'; use one of {', '.join(STORAGES)}")
    if storage == "int8":
        data, scale = quantize_rows(arr)
        _save(path[: -len(".npy")] + SCALE_SUFFIX, scale)
        _save(path, data)
    else:
        _save(path, np.ascontiguousarray(arr, dtype=np.float16 if storage == "fp16" else np.float32))


def _save(path: str, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)


def load_table(path: str):
    """A memory-mapped table: an ndarray (fp32/fp16) or a :class:`QuantTable` (int8 + scales)."""
    data = np.load(path, mmap_mode="r")
    if data.dtype != np.int8:
        return data
    scale_path = path[: -len(".npy")] + SCALE_SUFFIX
    if not os.path.exists(scale_path):
        raise InputError(f"int8 table '{path}' has no scales '{scale_path}'; re-export the bundle")
    return QuantTable(data, np.load(scale_path))


def storage_of(table) -> str:
    """``fp32``, ``fp16`` or ``int8``: how a loaded table is stored."""
    if isinstance(table, QuantTable):
        return "int8"
    return "fp16" if table.dtype == np.float16 else "fp32"
