"""The Qualcomm QNN runtime (onnxruntime-qnn, HTP fp16; x86 emulation here, the NPU on a Snapdragon).

* generation: :class:`QnnBackend`, the torch talker with the predictor (74 % of the CPU time per
  frame) as the plain fixed-shape step of :mod:`qtts.export.qnn` on the QNN EP. The talker's ONNX
  graph uses onnxruntime's GroupQueryAttention contrib op, which QNN cannot take.
  :class:`~qtts.backends.plain.PlainPredictor` drives that step from numpy for any runtime with
  a ``run(*arrays) -> (logits, kv)`` callable (QNN here, ExecuTorch in :mod:`qtts.backends.executorch`).
* vocoder: :class:`QnnVocoder`, the ONNX vocoder step of ``qtts export vocoder`` on QNN sessions
  (the step squares with ``x * x`` and folds SnakeBeta's ``exp``, so the HTP ``Pow(-0, 2)`` bug
  cannot bite).

onnxruntime-qnn >= 2.x is a *plugin* execution provider: it must be registered with
``ort.register_execution_provider_library`` and attached to a session through its EP devices
(``SessionOptions.add_provider_for_devices``). The legacy ``providers=["QNNExecutionProvider"]``
path silently runs on the CPU EP, so :func:`qnn_session` never uses it, and it disables the CPU
fallback by default: a graph with any node QNN cannot take fails at session creation instead of
quietly running part of it on the CPU. HTP facts (docs/npu.md): static shapes only, no contrib
ops; ``enable_htp_fp16_precision=1`` needs ``soc_model`` (43/57/60/69 emulate the same); without
fp16 the emulator cannot finalize real graphs; it computes ``Pow(-0.0, 2) = -4``.

Plan entries (``options`` for both: :class:`QnnOptions`)::

    {"predictor": {"impl": "qnn", "artifacts": {"main": "predictor_step.onnx"}, "precision": "fp16"},
     "vocoder": {"impl": "qnn", "artifacts": {"main": "vocoder_step4.onnx"}, "precision": "fp16"}}
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, QttsError, require
from .base import OpenContext
from .onnx import OnnxVocoder
from .plain import MASK_NEG, SLOTS, STEP_INPUTS, STEP_OUTPUTS, PlainPredictor  # noqa: F401 (re-exported)
from .torch import TorchBackend, load_part

log = logging.getLogger(__name__)

_registered = threading.Lock()
_done = False

EP_NAME = "QNNExecutionProvider"


@dataclass(frozen=True)
class QnnOptions:
    """How a QNN session is built (plan ``options`` of a ``qnn`` entry)."""

    soc_model: str = "57"  # Snapshdragon SoC id the HTP compiler targets (57 = SM8550); fp16 needs one
    fp16: bool = True  # HTP fp16 precision; the fp32 emulation path cannot finalize real graphs
    backend: str = "htp"  # htp (NPU) | gpu; there is no cpu backend library in onnxruntime-qnn
    cpu_fallback: bool = False  # True lets ORT run unsupported nodes on the CPU EP (never silently)

    @classmethod
    def from_plan(cls, options) -> QnnOptions:
        opts = dict(options or {})
        known = {"soc_model", "fp16", "backend", "cpu_fallback", "threads"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise InputError(f"qnn options: unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
        return cls(
            soc_model=str(opts.get("soc_model", cls.soc_model)),
            fp16=bool(opts.get("fp16", cls.fp16)),
            backend=str(opts.get("backend", cls.backend)),
            cpu_fallback=bool(opts.get("cpu_fallback", cls.cpu_fallback)),
        )


def _modules():
    ort = require("onnxruntime", "qnn", "the QNN execution provider")
    oq = require("onnxruntime_qnn", "qnn", "the QNN execution provider")
    return ort, oq


def register() -> None:
    """Register the QNN plugin EP library with onnxruntime (once per process)."""
    global _done
    ort, oq = _modules()
    with _registered:
        if _done:
            return
        # Measured here: when soundfile first loads libsndfile *after* a QNN HTP session was
        # created, every sf.write fails ("Invalid combination of format, subtype and endian").
        # Loading it before the QNN libraries avoids that (soundfile is a core dependency).
        require("soundfile", "qnn", "audio I/O")
        try:
            ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
        except Exception as exc:  # onnxruntime raises its own Fail type; re-raise ours with a hint
            if "already registered" not in str(exc):
                raise QttsError(f"could not register the QNN EP ({exc}); reinstall onnxruntime-qnn") from exc
        _done = True


def provider_options(opts: QnnOptions) -> dict:
    _, oq = _modules()
    libs = {"htp": "libQnnHtp.so", "gpu": "libQnnGpu.so"}
    if opts.backend not in libs:
        raise InputError(f"qnn backend '{opts.backend}' is not shipped by onnxruntime-qnn; use htp or gpu")
    out = {"backend_path": os.path.join(os.path.dirname(oq.__file__), libs[opts.backend])}
    if opts.fp16:
        out.update({"enable_htp_fp16_precision": "1", "soc_model": opts.soc_model})
    return out


def qnn_session(path: str, opts: QnnOptions | None = None):
    """An ``InferenceSession`` for ``path`` on the QNN EP (no CPU fallback unless ``opts`` allow it)."""
    ort, _ = _modules()
    opts = opts or QnnOptions()
    if not os.path.isfile(path):
        raise InputError(f"{path}: ONNX file not found")
    register()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise QttsError(
            "onnxruntime lists no QNN EP device; is onnxruntime-qnn installed for this onnxruntime?"
        )
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if opts.cpu_fallback else "1")
    so.add_provider_for_devices(devices, provider_options(opts))
    try:
        return ort.InferenceSession(path, sess_options=so)
    except Exception as exc:  # ORT's Fail / InvalidGraph: name the usual causes
        raise QttsError(
            f"{path}: QNN could not compile the graph ({exc}). QNN needs static shapes and standard ONNX "
            "ops (no com.microsoft contrib ops); export with `qtts export qnn`"
        ) from exc


def session_runner(session) -> tuple[Callable, tuple]:
    """(run callable, kv shape) for an onnxruntime session of the plain predictor step."""
    shapes = {i.name: i.shape for i in session.get_inputs()}
    if set(shapes) != set(STEP_INPUTS):
        raise InputError(f"not a qtts plain predictor step (inputs {sorted(shapes)}); use `qtts export qnn`")

    def run(*arrays):
        return session.run(list(STEP_OUTPUTS), dict(zip(STEP_INPUTS, arrays)))

    return run, tuple(shapes["kv"])


class QnnBackend(TorchBackend):
    """Torch talker + QNN predictor; the predictor runs one frame at a time (not thread safe)."""

    thread_safe = False

    def __init__(self, talker, predictor: PlainPredictor, threads: int | None = None):
        super().__init__(talker, threads=threads)
        self.plain = predictor

    def predict_frame(self, hidden: np.ndarray, code0: int, sampler, uniforms: np.ndarray) -> np.ndarray:
        return self.plain.predict_frame(hidden, code0, sampler, uniforms)

    def predictor_logits(self, hidden, code0: int, sampler, uniforms):
        """The plain step's logits (TorchBackend's would call predict_frame with its heads list)."""
        return self.plain.predictor_logits(hidden, code0, sampler, uniforms)


def torch_tables(talker) -> tuple[np.ndarray, np.ndarray]:
    """(talker codec embedding [V0, H], predictor codec embeddings [15, V, H]) as fp32 numpy."""
    import torch

    with torch.no_grad():
        codec = talker.model.codec_embedding.weight.float().numpy()
        tables = torch.stack([e.weight for e in talker.code_predictor.model.codec_embedding]).float().numpy()
    return codec, tables


class QnnVocoder(OnnxVocoder):
    """:class:`~qtts.backends.onnx.OnnxVocoder` whose sessions are QNN EP sessions."""

    def __init__(self, main: str, first: str | None = None, options=None):
        opts = options if isinstance(options, QnnOptions) else QnnOptions.from_plan(options)
        super().__init__(main, first, session_factory=lambda path: qnn_session(path, opts))


def open_generation(talker_spec, predictor_spec, ctx: OpenContext) -> QnnBackend:
    if predictor_spec.impl != "qnn" or talker_spec.impl != "torch":
        raise InputError("impl qnn runs the predictor only; name it in the plan (the talker stays torch)")
    talker = load_part(ctx, "talker")
    session = qnn_session(predictor_spec.artifacts["main"], QnnOptions.from_plan(predictor_spec.options))
    run, kv_shape = session_runner(session)
    return QnnBackend(talker, PlainPredictor(run, *torch_tables(talker), kv_shape), threads=ctx.threads)


OPENERS = {
    "generation": open_generation,
    "vocoder": lambda spec, ctx: QnnVocoder(spec.artifacts["main"], spec.artifacts.get("first"), spec.options),
}
