"""Runtimes behind the generation loop's seam (:class:`~qtts.backends.base.Backend`).

:func:`create_backend` picks one from an execution plan; a new runtime registers a factory in
``FACTORIES`` under its plan ``impl`` name (``torch`` here; ``onnx`` and others are added by their
modules). Factories are imported lazily so the core install never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import InputError
from .base import Backend, sample_residuals

__all__ = ["Backend", "FACTORIES", "create_backend", "sample_residuals"]

#: plan impl name -> "module:function"; the function is called as
#: ``factory(snapshot_dir, components: dict, checkpoint=None, dtype=..., threads=...)``
#: where ``components`` are the plan entries for ``talker`` / ``code_predictor``.
FACTORIES: dict[str, str] = {
    "torch": "qtts.backends.torch:create",
    "onnx": "qtts.backends.onnx:create",
    "qnn": "qtts.backends.qnn:create",
}


def create_backend(
    snapshot_dir: str,
    plan: Any = None,
    checkpoint: Any = None,
    dtype: str = "float32",
    threads: int | None = None,
) -> Backend:
    """The talker/predictor runtime named by ``plan`` (torch when the plan says nothing)."""
    components = {}
    for name in ("talker", "code_predictor"):
        entry = _plan_entry(plan, name)
        if entry is not None:
            components[name] = entry
    # a torch talker may pair with another code_predictor runtime (impl qnn: torch talker + QNN predictor)
    impls = {_impl(e) for e in components.values()} - {"torch"} or {"torch"}
    if len(impls) != 1:
        raise InputError(
            f"the plan mixes runtimes for talker and code_predictor ({', '.join(sorted(impls))}); "
            "use the same impl for both"
        )
    impl = impls.pop()
    if impl not in FACTORIES:
        raise InputError(
            f"no generation backend for impl '{impl}'; valid: {', '.join(sorted(FACTORIES))}"
        )
    module, func = FACTORIES[impl].split(":")
    factory = getattr(importlib.import_module(module), func)
    return factory(snapshot_dir, components, checkpoint=checkpoint, dtype=dtype, threads=threads)


def _plan_entry(plan: Any, name: str):
    if plan is None:
        return None
    if isinstance(plan, dict):
        return plan.get(name)
    getter = getattr(plan, "get", None) or getattr(plan, "component", None)
    if getter is not None:
        return getter(name)
    return getattr(plan, name, None)


def _impl(entry: Any) -> str:
    return entry.get("impl", "torch") if isinstance(entry, dict) else getattr(entry, "impl", "torch")
