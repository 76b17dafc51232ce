"""Exported bundles: ``manifest.json`` beside ``plan.json``, and the checkpoint fingerprint.

Exporters (``qtts.export``) write the manifest with :func:`write_json`; runtimes read it with
:func:`read_manifest`; :func:`check_plan_source` refuses a plan exported from another checkpoint.

The fingerprint (:func:`fingerprint`) is cheap to compute at every load, yet tells checkpoints
apart: a sha256 over both ``config.json`` files and, per ``*.safetensors`` file, its size, its
header (names, dtypes, shapes, offsets) and 16 evenly spaced 4 KiB blocks of its data. Two random
checkpoints of one layout and different seeds differ in the sampled data; reading them costs a
few hundred KiB whatever the checkpoint size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct

from ..errors import InputError
from ..files import atomic_path
from .plan import renamed

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PLAN = "plan.json"
_BLOCKS, _BLOCK = 16, 4096
_CONFIGS = ("config.json", os.path.join("speech_tokenizer", "config.json"))


def read_manifest(bundle: str) -> dict:
    """The manifest of a bundle directory, with component keys under today's names."""
    path = os.path.join(bundle, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read bundle manifest '{path}' ({exc}); re-run 'qtts export onnx'") from exc
    for key in ("graphs", "precision"):
        if isinstance(data.get(key), dict):
            data[key] = renamed(data[key], path)
    return data


def write_json(path: str, data: dict) -> None:
    """Sorted, indented JSON written to a temporary name, then renamed."""
    with atomic_path(path, ".json.part") as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")


def _hash_safetensors(h, path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
        h.update(struct.pack("<QQ", size, n) + fh.read(min(n, 1 << 24)))
        data = 8 + n
        span = max(size - data - _BLOCK, 0)
        for i in range(_BLOCKS):
            fh.seek(data + span * i // max(_BLOCKS - 1, 1))
            h.update(fh.read(_BLOCK))


def fingerprint(snapshot: str) -> str:
    """A short hex id of a checkpoint directory (see the module docstring)."""
    h = hashlib.sha256()
    for rel in _CONFIGS:
        path = os.path.join(snapshot, rel)
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                h.update(rel.encode() + b"\0" + fh.read())
    for root, dirs, files in os.walk(snapshot):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".safetensors")):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, snapshot).encode() + b"\0")
            _hash_safetensors(h, path)
    return h.hexdigest()[:16]


def codec_fingerprint(snapshot: str) -> str:
    """The fingerprint of the speech tokenizer alone (``speech_tokenizer/``): codec frames made with
    one checkpoint decode the same on any checkpoint that shares it (the official 0.6B and 1.7B do)."""
    return fingerprint(os.path.join(snapshot, "speech_tokenizer"))


def source_info(snapshot: str) -> dict:
    """What a manifest records about the checkpoint it was exported from."""
    return {"model": os.path.abspath(snapshot), "fingerprint": fingerprint(snapshot)}


def check_plan_source(plan, snapshot: str) -> None:
    """Refuse a plan whose bundle manifest names another checkpoint (InputError naming both).

    Plans without a manifest beside them (hand-written, ``qtts export vocoder`` snippets) are not
    checked; a manifest without a fingerprint (older exports) loads with a warning.
    """
    if plan.path is None or not os.path.isfile(os.path.join(os.path.dirname(plan.path), MANIFEST)):
        return
    source = read_manifest(os.path.dirname(plan.path)).get("source", {})
    if "fingerprint" not in source:
        log.warning("%s: the bundle records no checkpoint fingerprint (exported by an older qtts), so "
                    "it cannot be checked against %s; re-export it to enable the check", plan.path, snapshot)
        return
    ours = fingerprint(snapshot)
    if source["fingerprint"] != ours:
        raise InputError(
            f"{plan.path} was exported from another checkpoint: {source.get('model', '?')} (fingerprint "
            f"{source['fingerprint']}), but --model is {snapshot} (fingerprint {ours}); pass the checkpoint "
            "the bundle was exported from, or re-export the bundle from this one"
        )
