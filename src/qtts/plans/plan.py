"""Execution plan: which implementation runs each component, and from which artifacts.

A plan is a JSON object (schema in docs/plan.md)::

    {
      "vocoder": {"impl": "onnx",
                  "artifacts": {"main": "voc16.onnx", "first": "voc2.onnx"},
                  "options": {"threads": 2}}
    }

Keys are component names (:data:`COMPONENTS`); an optional ``"version": 1`` key is accepted. Plans
written before the rename still load: ``code_predictor`` reads as ``predictor`` and
``speech_decoder`` as ``vocoder`` (:data:`LEGACY_NAMES`).
Each entry has ``impl`` (:data:`IMPLS`), ``artifacts`` (name -> file; ``main`` is required
for every impl but torch; relative paths resolve against the plan file's directory, and the
files must exist), optional ``options`` (a free-form object the implementation reads) and
optional ``precision`` (informational string written by exporters).
Components a plan does not name run with ``torch``.

An exported bundle is a folder: ``plan.json``, ``manifest.json`` beside it, the graphs and
``tables/*.npy``. Exporters (``qtts.export``) write the manifest with :func:`write_json`; runtimes
read it with :func:`read_manifest`; :func:`check_plan_source` refuses a plan exported from another
checkpoint.

The tables (the text, codec and predictor embeddings: a generation gathers a few rows) are
memory-mapped ``.npy`` files in one of :data:`STORAGES`: ``fp32`` / ``fp16`` as they are (rows read
back as fp32), or ``int8`` with one fp32 scale per row in ``NAME.scale.npy`` (a row reads back as
``int8 * scale``; ~42 dB of row SNR for a Gaussian row of 2048, docs/fidelity.md has the gate).
:func:`load_table` finds the storage from the file itself, so the manifest names one path per table;
``qtts.export.write.save_table`` writes them.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import InputError
from ..files import atomic_path

log = logging.getLogger(__name__)

COMPONENTS = ("talker", "predictor", "vocoder", "speaker_encoder", "speech_encoder")
#: what a plan may name besides the TTS components: the forced aligner of word timestamps
#: (impl torch or onnx; its snapshot is a separate checkpoint, qtts.align.runtime)
PLAN_KEYS = COMPONENTS + ("aligner",)
#: names older qtts versions wrote (plan keys, manifest keys) -> today's name
LEGACY_NAMES = {"code_predictor": "predictor", "speech_decoder": "vocoder"}
IMPLS = ("torch", "onnx", "rknn", "qnn", "executorch")
PLAN_VERSION = 1
_ENTRY_KEYS = ("impl", "artifacts", "options", "precision")
#: the plan name of the torch fp32 reference, and the variable that names a plan when a caller passes none
#: (qtts.plans.cache reads both too: it resolves every other plan name)
TORCH, ENV_PLAN = "torch", "QTTS_PLAN"
MANIFEST = "manifest.json"
PLAN = "plan.json"
_BLOCKS, _BLOCK = 16, 4096
_CONFIGS = ("config.json", os.path.join("speech_tokenizer", "config.json"))


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    impl: str = "torch"
    artifacts: Mapping[str, str] = field(default_factory=dict)  # absolute paths
    options: Mapping[str, Any] = field(default_factory=dict)
    precision: str | None = None  # informational (what an export wrote: fp32 / fp16 / int8 / int4)

    def artifact(self, key: str) -> str | None:
        return self.artifacts.get(key)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"impl": self.impl}
        if self.artifacts:
            out["artifacts"] = dict(self.artifacts)
        if self.options:
            out["options"] = dict(self.options)
        if self.precision:
            out["precision"] = self.precision
        return out


@dataclass(frozen=True)
class Plan:
    components: Mapping[str, ComponentSpec] = field(default_factory=dict)
    path: str | None = None  # the file it was read from, if any

    def get(self, name: str) -> ComponentSpec:
        """The entry for ``name``; a torch entry when the plan does not name it."""
        if name not in PLAN_KEYS:
            raise InputError(f"unknown component '{name}'; known: {', '.join(PLAN_KEYS)}")
        return self.components.get(name) or ComponentSpec(name)

    def impl(self, name: str) -> str:
        return self.get(name).impl

    def to_dict(self) -> dict:
        return {name: spec.to_dict() for name, spec in self.components.items()}


def _entry(name: str, data: Any, base_dir: str, where: str) -> ComponentSpec:
    w = f"{where}: {name}"
    if not isinstance(data, dict):
        raise InputError(f"{w}: expected an object with 'impl' and 'artifacts', got {type(data).__name__}")
    unknown = sorted(set(data) - set(_ENTRY_KEYS))
    if unknown:
        raise InputError(f"{w}: unknown keys {unknown}; allowed: {', '.join(_ENTRY_KEYS)}")
    impl = data.get("impl")
    if not isinstance(impl, str) or impl not in IMPLS:
        raise InputError(f"{w}: 'impl' must be one of {', '.join(IMPLS)}, got {impl!r}")
    arts = data.get("artifacts", {})
    if not isinstance(arts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in arts.items()
    ):
        raise InputError(f"{w}: 'artifacts' must map names to file paths (strings)")
    if impl != "torch" and "main" not in arts and name != "aligner":  # an aligner graph may come from the cache
        raise InputError(f"{w}: impl '{impl}' needs artifacts.main (the compiled file)")
    resolved = {}
    for key, path in arts.items():
        full = path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))
        if not os.path.isfile(full):
            raise InputError(f"{w}: artifact '{key}' not found: {full} (paths are relative to the plan file)")
        resolved[key] = full
    opts = data.get("options", {})
    if not isinstance(opts, dict):
        raise InputError(f"{w}: 'options' must be an object")
    precision = data.get("precision")
    if precision is not None and not isinstance(precision, str):
        raise InputError(f"{w}: 'precision' must be a string such as \"fp32\"")
    return ComponentSpec(name, impl, MappingProxyType(resolved), MappingProxyType(dict(opts)), precision)


def parse_plan(data: Any, base_dir: str = ".", where: str = "plan") -> Plan:
    """Validate a decoded plan object; raises InputError naming the problem."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: a plan must be a JSON object of components, got {type(data).__name__}")
    version = data.get("version", PLAN_VERSION)
    if version != PLAN_VERSION:
        raise InputError(f"{where}: unsupported plan version {version!r}; this qtts reads version {PLAN_VERSION}")
    entries = renamed({k: v for k, v in data.items() if k != "version"}, where)
    unknown = sorted(set(entries) - set(PLAN_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown component '{unknown[0]}'; known: {', '.join(PLAN_KEYS)}")
    comps = {name: _entry(name, entry, base_dir, where) for name, entry in entries.items()}
    return Plan(MappingProxyType(comps))


def renamed(data: dict, where: str) -> dict:
    """``data`` with legacy component names (:data:`LEGACY_NAMES`) replaced by today's."""
    out = {}
    for key, value in data.items():
        name = LEGACY_NAMES.get(key, key)
        if name in out:
            raise InputError(f"{where}: '{key}' and '{name}' name the same component; keep '{name}'")
        out[name] = value
    return out


def names_torch(plan) -> bool:
    """True when ``plan`` (or ``$QTTS_PLAN`` when ``plan`` is None) is ``"torch"``: the torch fp32
    reference, the empty :class:`Plan`. :func:`qtts.backends.open` then needs no plan cache (presets,
    bundles, builds: :mod:`qtts.plans.cache`), which resolves every other plan argument."""
    if plan is None:
        plan = os.environ.get(ENV_PLAN) or None
    return isinstance(plan, str) and plan == TORCH


#: the presets whose vocoder is the bf16 step (torch) where this machine runs bf16 natively: it meets the
#: bf16 bar (docs/fidelity.md) at about a quarter of the fp32 step's CPU; ``QTTS_BF16_VOCODER=0`` keeps
#: the bundle's fp32 ONNX vocoder, as do machines without torch or without bf16 instructions
BF16_VOCODER_PRESETS, BF16_VOCODER_ENV = ("fast", "fastest"), "QTTS_BF16_VOCODER"
#: what /proc/cpuinfo calls the instructions oneDNN's bf16 convolutions need (x86: AVX512-BF16 or AMX)
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_vocoder_may_run_here() -> bool:
    """:func:`bf16_vocoder_runs_here` without importing torch: False where the answer is certainly no
    (switched off, torch not installed, a Linux x86 CPU without bf16 instructions), else True (torch
    still has to confirm)."""
    import importlib.util

    if os.environ.get(BF16_VOCODER_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = next((line for line in fh if line.startswith("flags")), None)
    except OSError:
        flags = None
    return flags is None or any(f in flags.split() for f in _BF16_FLAGS)


def bf16_vocoder_runs_here() -> bool:
    """True when the bf16 vocoder step runs natively: not switched off, torch installed, and oneDNN
    has bf16 convolutions on this CPU (on Linux x86 read from /proc/cpuinfo first, so a CPU
    without them never imports torch for the answer)."""
    if not bf16_vocoder_may_run_here():
        return False
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_vocoder_fits(plan: Plan, preset: str | None) -> bool:
    """True when ``plan``, the bundle of a :data:`BF16_VOCODER_PRESETS` preset, has the fp32 ONNX vocoder."""
    return preset in BF16_VOCODER_PRESETS and plan.impl("vocoder") == "onnx"


def with_bf16_vocoder(plan: Plan, preset: str | None) -> Plan:
    """``plan`` with the bf16 vocoder step in place of its fp32 ONNX one where :func:`bf16_vocoder_fits`
    and :func:`bf16_vocoder_runs_here`; else ``plan`` unchanged."""
    if not bf16_vocoder_fits(plan, preset) or not bf16_vocoder_runs_here():
        return plan
    bf16 = ComponentSpec("vocoder", "torch", options={"precision": "bf16", "main": 8, "threads": 1}, precision="bf16")
    log.info("vocoder: the bf16 step (torch, this CPU has bf16 instructions; %s=0 for the fp32 one)",
             BF16_VOCODER_ENV)
    return Plan({**plan.components, "vocoder": bf16}, path=plan.path)


def load_plan(plan: str | os.PathLike | dict | Plan | None) -> Plan:
    """A Plan from a file path, an already-decoded dict (paths relative to the cwd), or None."""
    if plan is None:
        return Plan()
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return parse_plan(plan, os.getcwd())
    path = os.fspath(plan)
    if not os.path.isfile(path):
        raise InputError(f"{path}: plan file not found")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from exc
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a plan file (not UTF-8 text); a plan is the JSON file that "
                         "qtts export writes (BUNDLE/plan.json)") from None
    parsed = parse_plan(data, os.path.dirname(os.path.abspath(path)), path)
    return Plan(parsed.components, os.path.abspath(path))


def plan_snippet(component: str, impl: str, artifacts: dict[str, str], options: dict | None = None) -> str:
    """The JSON a user pastes into a plan for what an export produced."""
    entry: dict[str, Any] = {"impl": impl, "artifacts": artifacts}
    if options:
        entry["options"] = options
    return json.dumps({component: entry}, indent=2)


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
