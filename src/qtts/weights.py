"""Where a checkpoint comes from: a local snapshot directory or a hub id, then the strict loader.

``load_checkpoint(path_or_hub_id, dtype=...)`` = :func:`resolve_snapshot` (a local directory as is; a
hub id from the local Hugging Face cache, downloaded when online) + :func:`qtts.model.checkpoint.load_dir`
(meta-device modules, ``load_state_dict(strict=True, assign=True)`` from memory-mapped safetensors,
beside the modules whose keys it loads). The loader's names are re-exported here, their old home.

Importing this module imports no torch: a core install (ONNX Runtime, no torch) resolves hub ids
here too; the loader's names (and torch) are imported on first use.
"""

from __future__ import annotations

import logging
import os
import re

from .errors import InputError, require

#: the loader's names, re-exported from :mod:`qtts.model.checkpoint` on first use (it imports torch)
_LOADER = ("CHECKPOINT_ROOTS", "Checkpoint", "empty_init", "load_dir", "load_into", "load_tensors", "to_dtype")
__all__ = ["load_checkpoint", "resolve_snapshot", *_LOADER]

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def __getattr__(name: str):
    if name in _LOADER:
        from .model import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_checkpoint(path_or_hub_id: str, dtype=None, components=None, device=None, speech_tokenizer_dtype=None):
    """Load a snapshot: ``config``, ``model`` (talker [+ speaker encoder]), ``speech_tokenizer`` (decoder [+ encoder]).

    ``dtype`` None: float32; ``components`` None: every checkpoint root (:data:`CHECKPOINT_ROOTS`)."""
    import torch

    from .model.checkpoint import CHECKPOINT_ROOTS, load_dir

    return load_dir(resolve_snapshot(path_or_hub_id), torch.float32 if dtype is None else dtype,
                    CHECKPOINT_ROOTS if components is None else components, device, speech_tokenizer_dtype)


def resolve_snapshot(path_or_hub_id: str, revision: str | None = None) -> str:
    """A local snapshot directory, or a hub id ("Qwen/Qwen3-TTS-12Hz-0.6B-Base") via huggingface_hub.

    Hub ids are looked up in the local Hugging Face cache first (``HF_HUB_CACHE`` / ``HF_HOME``),
    then downloaded when online.
    """
    path = os.path.expanduser(str(path_or_hub_id))
    if os.path.isdir(path):
        return os.path.abspath(path)
    if not _HUB_ID.match(path):
        raise InputError(
            f"{path}: no such snapshot directory; pass a local Qwen3-TTS snapshot directory "
            "or a hub id like Qwen/Qwen3-TTS-12Hz-0.6B-Base"
        )
    hub = require("huggingface_hub", "hub", "resolving hub ids")
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        return hub.snapshot_download(path, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    how = (
        f"download it into the cache with `hf download {path}` (the Hugging Face CLI, pip install "
        f"'huggingface_hub>=0.34'); without network here, run `hf download {path} --local-dir DIR` "
        "on a machine that has it, copy DIR here and pass DIR as the model"
    )
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise InputError(f"{path}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {how}")
    log.info("downloading %s from the Hugging Face hub", path)
    try:
        return hub.snapshot_download(path, revision=revision, cache_dir=cache_dir)
    except RepositoryNotFoundError as exc:
        raise InputError(f"{path}: no such repository on the Hugging Face hub (check the id)") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise InputError(f"{path}: not in the local cache and the download failed ({exc}); {how}") from exc
