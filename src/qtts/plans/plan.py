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
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import InputError

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
