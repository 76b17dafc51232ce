"""Atomic file writes that honour the umask.

Every output file is written to a temporary name in its target directory and renamed when
complete, so a failed run never leaves a half-written file at the target path. The temporary
file is created like ``open(path, "w")`` creates files (mode ``0o666`` minus the umask), not
private like ``tempfile.mkstemp`` (``0o600``), so a ``.wav`` or ``.onnx`` gets the permissions
the user expects from any other program.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat


def temp_beside(path: str, suffix: str = ".part") -> str:
    """Create a new empty file next to ``path`` (mode 0o666 & ~umask) and return its name."""
    directory = os.path.dirname(os.path.abspath(path))
    while True:
        tmp = os.path.join(directory, f".qtts-{secrets.token_hex(6)}{suffix}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp


def temp_dir_beside(path: str, suffix: str = ".part") -> str:
    """Create a new empty folder next to ``path`` (mode 0o777 & ~umask, unlike ``mkdtemp``'s 0o700),
    for outputs that are a whole folder, renamed onto ``path`` when complete."""
    directory = os.path.dirname(os.path.abspath(path))
    while True:
        tmp = os.path.join(directory, f".qtts-{secrets.token_hex(6)}{suffix}")
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        return tmp


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ".part"):
    """Yield a temporary file name beside ``path``: published onto ``path`` when the block
    succeeds (:func:`publish`, so a writer that re-creates the file privately does not matter),
    removed when it raises."""
    tmp = temp_beside(path, suffix)
    try:
        yield tmp
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def publish(src: str, dst: str) -> None:
    """Rename a finished file onto ``dst`` with the mode a new file in that folder gets
    (for writers that create private files, such as onnx's external-data writer)."""
    probe = temp_beside(dst, ".mode")
    try:
        os.chmod(src, stat.S_IMODE(os.stat(probe).st_mode))
    finally:
        os.unlink(probe)
    os.replace(src, dst)
