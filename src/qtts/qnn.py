"""onnxruntime-qnn sessions: Qualcomm QNN HTP (x86 emulation here, the NPU on a Snapdragon device).

onnxruntime-qnn >= 2.x is a *plugin* execution provider: it must be registered with
``ort.register_execution_provider_library`` and attached to a session through its EP devices
(``SessionOptions.add_provider_for_devices``). The legacy ``providers=["QNNExecutionProvider"]``
path silently runs on the CPU EP, so :func:`qnn_session` never uses it, and it disables the CPU
fallback by default: a graph with any node QNN cannot take fails at session creation instead of
quietly running part of it on the CPU.

HTP facts that shape the graphs we feed it (see docs/npu.md):

* static shapes only (no Shape / dynamic axes) and no contrib ops (GroupQueryAttention);
* ``enable_htp_fp16_precision=1`` needs ``soc_model`` (any of 43/57/60/69 emulate the same);
  without fp16 the HTP emulator fails to finalize real graphs (``QNN_COMMON_ERROR_MEM_ALLOC``);
* the emulator computes ``Pow(-0.0, 2) = -4``: graphs must square with ``x * x``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from .errors import InputError, QttsError, require

log = logging.getLogger(__name__)

EP_NAME = "QNNExecutionProvider"
_registered = threading.Lock()
_done = False


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
