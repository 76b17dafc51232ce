"""Fast by default: the plan a load runs when it is given none, from a cache of built ONNX bundles.

:func:`resolve_plan` turns what a caller passed as ``plan`` into what :func:`qtts.backends.open`
loads: ``"torch"`` -> the torch fp32 reference; a preset name (:data:`PRESETS`) -> that preset's
bundle for this checkpoint; ``None`` -> ``$QTTS_PLAN`` if set, else the :data:`DEFAULT_PRESET`;
anything else is a plan file path (or a dict / Plan), as before.

A preset's bundle lives in ``$QTTS_CACHE`` (default ``~/.cache/qtts``) under
``bundles/<fingerprint>-<preset>-<key>``: the checkpoint fingerprint (:func:`qtts.bundle.fingerprint`),
the preset, and a hash of everything else the bundle depends on (:func:`cache_key`: the qtts version,
:data:`FORMAT`, the onnxruntime version that quantizes and runs it, the preset's export options).
A missing bundle is built once (:mod:`qtts.export.cache_build`, the one place where loading reaches
the exporter, and only then) when the export extra is
installed, unless ``no_build`` / ``$QTTS_NO_BUILD=1``, which make it an error naming the command
that builds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass

from ..errors import InputError
from .plan import Plan

log = logging.getLogger(__name__)

TORCH = "torch"
ENV_CACHE, ENV_PLAN, ENV_NO_BUILD = "QTTS_CACHE", "QTTS_PLAN", "QTTS_NO_BUILD"
#: bump when the layout of a cached bundle changes in a way a version bump would not show
FORMAT = 1
INFO = "cache.json"  # beside plan.json: what the cache knows of the bundle (preset, checkpoint, versions)
INSTALL_EXPORT = 'pip install -e ".[export]"'


@dataclass(frozen=True)
class Preset:
    """A named export recipe (:class:`qtts.export.onnx.ExportOptions` fields)."""

    #: weight precision of the talker and of the predictor
    talker: str
    predictor: str
    #: storage of the gathered embedding tables (fp16 halves the 1.24 GB text embedding)
    tables: str
    #: MatMulNBits block size (128: the fastest; docs/fidelity.md for what it costs)
    block_size: int = 128
    #: one line for ``qtts cache ls`` and the docs
    summary: str = ""


PRESETS = {
    "faithful": Preset("fp32", "fp32", "fp32", summary="fp32 ONNX: the torch reference's codes, faster"),
    "fast": Preset("int8", "int8", "fp16", summary="int8 weights (block 128), fp16 tables: the default"),
    "fastest": Preset("int4", "int4", "fp16", summary="int4 weights (block 128): fails the fidelity gate, opt-in"),
}
#: the preset the rule in docs/fidelity.md picks: the fastest one whose teacher-forced talker and
#: predictor logits stay >= 25 dB at full size and that streams at RTF <= 0.9 on a 2-core CPU
DEFAULT_PRESET = "fast"
ALIASES = {"default": DEFAULT_PRESET}


def cache_root() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get(ENV_CACHE) or os.path.join("~", ".cache", "qtts")))


def bundles_dir(root: str | None = None) -> str:
    return os.path.join(root or cache_root(), "bundles")


def runtime_version() -> str:
    """The installed onnxruntime's version (it quantizes the bundle and runs it)."""
    from importlib import metadata

    for dist in ("onnxruntime", "onnxruntime-qnn", "onnxruntime-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def cache_key(fingerprint: str, preset: str) -> str:
    """``<fingerprint>-<preset>-<hash>``: another checkpoint, preset, qtts version, format or
    onnxruntime version never shares a bundle."""
    from .. import __version__

    deps = {"qtts": __version__, "format": FORMAT, "onnxruntime": runtime_version(),
            "preset": asdict(PRESETS[preset])}  # fmt: skip
    digest = hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:10]
    return f"{fingerprint}-{preset}-{digest}"


def preset_name(plan) -> str | None:
    """The preset a ``plan`` argument names (aliases resolved), else None (a path, dict, Plan)."""
    if not isinstance(plan, str):
        return None
    name = ALIASES.get(plan, plan)
    return name if name in PRESETS and not os.path.exists(plan) else None


def env_no_build() -> bool:
    return os.environ.get(ENV_NO_BUILD, "").strip().lower() not in ("", "0", "false", "no")


def resolve_plan(plan, snapshot: str, dtype: str = "float32", backend=None, no_build: bool | None = None,
                 listeners: tuple = ()):
    """What ``plan`` means for the checkpoint at ``snapshot`` (see the module docstring): a Plan,
    a dict or a plan file path. ``listeners`` get ``(percent, phase)`` while a bundle is built."""
    if plan is None:
        plan = os.environ.get(ENV_PLAN) or None
        if plan is None and (dtype != "float32" or backend is not None):
            return Plan()  # a torch dtype, or an injected generation backend: the torch parts as before
        if plan is None:
            return _default(snapshot, no_build, listeners)
    if plan == TORCH:
        return Plan()
    name = preset_name(plan)
    if name is None:
        return plan
    return bundle_plan(snapshot, name, no_build=no_build, listeners=listeners)


EXPORT_MODULES = ("torch", "onnx", "onnx_ir")


def export_missing() -> str | None:
    """The first module building a bundle needs that is not installed, or None."""
    import importlib.util

    for module in EXPORT_MODULES:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def _default(snapshot: str, no_build, listeners):
    """The default preset's bundle; without the export extra and no bundle: torch, said once."""
    if find_bundle(snapshot, DEFAULT_PRESET) is None and export_missing() and _has_torch():
        missing = export_missing()
        log.warning("qtts: no cached '%s' plan for %s and %s is not installed to build it: running the "
                    "torch fp32 reference (slow); %s builds the fast plan once (--plan torch: no notice)",
                    DEFAULT_PRESET, snapshot, missing, INSTALL_EXPORT)
        return Plan()
    return bundle_plan(snapshot, DEFAULT_PRESET, no_build=no_build, listeners=listeners)


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def find_bundle(snapshot: str, preset: str, root: str | None = None) -> str | None:
    """The plan.json of the cached bundle of ``preset`` for this checkpoint, or None."""
    from .bundle import fingerprint

    path = os.path.join(bundles_dir(root), cache_key(fingerprint(snapshot), preset), "plan.json")
    return path if os.path.isfile(path) else None


def bundle_plan(snapshot: str, preset: str, no_build: bool | None = None, listeners: tuple = ()) -> str:
    """The plan.json of ``preset``'s bundle for ``snapshot``, built first when missing."""
    found = find_bundle(snapshot, preset)
    if found is not None:
        log.info("qtts: plan '%s' from the cache: %s", preset, os.path.dirname(found))
        return found
    no_build = env_no_build() if no_build is None else no_build
    if no_build:
        raise InputError(
            f"no cached '{preset}' plan for {snapshot} and building is off (--no-build / {ENV_NO_BUILD}=1); "
            f"build it first with: qtts cache build -m {snapshot} --plan {preset}, or pass --plan torch"
        )
    from ..export.cache_build import build  # the exporter, imported only to build (the allowed edge)

    return build(snapshot, preset, listeners)


def plan_label(plan: Plan) -> str:
    """What runs, for logs and /health: 'fast (onnx: talker int8, predictor int8, vocoder fp32)'."""
    specs = [(name, plan.get(name)) for name in ("talker", "predictor", "vocoder")]
    impls = {spec.impl for _, spec in specs}
    if impls == {"torch"}:
        return "torch fp32 reference"
    parts = ", ".join(f"{name} {spec.precision or 'fp32'}" if len(impls) == 1 else
                      f"{name} {spec.impl} {spec.precision or 'fp32'}" for name, spec in specs)  # fmt: skip
    body = f"{impls.pop()}: {parts}" if len(impls) == 1 else parts
    info = read_info(os.path.dirname(plan.path)) if plan.path else {}
    name = info.get("preset") or (f"plan {plan.path}" if plan.path else "plan")
    return f"{name} ({body})"


def plan_short(plan: Plan) -> str:
    """'fast', 'torch' or the plan file: the summary line's ``plan=``."""
    if all(plan.get(name).impl == "torch" for name in ("talker", "predictor", "vocoder")):
        return TORCH
    return (read_info(os.path.dirname(plan.path)).get("preset") if plan.path else None) or str(plan.path or "plan")


def read_info(bundle: str) -> dict:
    try:
        with open(os.path.join(bundle, INFO), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}
