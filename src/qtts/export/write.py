"""Writing ONNX files: the TorchScript exporter (opset 17) behind one quiet, deterministic, atomic call.

* :func:`export_graph`: a bundle graph, weights in a ``<name>.data`` file beside it;
* :func:`export_single_file`: one self-contained file with qtts metadata, for the fixed-shape step
  graphs NPU toolchains load as a single file (the vocoder step, the plain predictor step);
* :func:`save_model`: deterministic save (no producer version, no timestamps) to a temp name, renamed;
* :func:`write_tables`: a bundle's embedding and RoPE tables (``tables/*.npy``, stored by
  :func:`save_table`, read by :func:`qtts.plans.plan.load_table`); :func:`checkpoint_hash`: the manifest's sha256 of the weights.

torch's exporter warnings (tracer constants, the legacy-exporter notice) are expected here and go
to this module's log at debug level instead of the user's terminal.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import warnings

import numpy as np

from ..errors import InputError, require
from ..files import atomic_path, publish, temp_beside
from ..plans.plan import SCALE_SUFFIX, STORAGES

log = logging.getLogger(__name__)

OPSET = 17


@contextlib.contextmanager
def quiet_export():
    """Record every Python warning raised inside, then log each at debug level."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        log.debug("export: %s: %s", w.category.__name__, w.message)


#: set to 1 to keep torch's IR self-checks during export (:func:`without_ir_lint`), e.g. to report a torch bug
LINT_ENV = "QTTS_EXPORT_LINT"
_LINT: dict = {}  # torch's own _jit_pass_lint, saved before the first swap


def _skip_lint(graph) -> None:
    return None


@contextlib.contextmanager
def without_ir_lint(torch):
    """Skip torch's TorchScript IR self-check (``torch._C._jit_pass_lint``) inside.

    The TorchScript exporter runs it ten times per graph; it only asserts the IR's invariants and
    changes nothing (the same bytes out: tests/export/test_torch_export.py), yet it is a large part of
    a small graph's export time. ``QTTS_EXPORT_LINT=1`` keeps it."""
    real = _LINT.setdefault("pass", getattr(torch._C, "_jit_pass_lint", None))
    if real is None or os.environ.get(LINT_ENV, "") not in ("", "0"):
        yield
        return
    torch._C._jit_pass_lint = _skip_lint
    try:
        yield
    finally:  # a concurrent export still inside merely runs the checks again
        torch._C._jit_pass_lint = real


def in_fresh_thread(fn):
    """``fn()`` run in a new thread (its result returned, its exception raised here).

    torch's tracer records the whole Python stack of every node it traces; from a new thread that
    stack is the export's own frames only, not the caller's (a test runner, a server): a deep caller
    made each traced node dearer (tests/export/test_torch_export.py)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as is
            result["error"] = exc

    # daemon: Ctrl-C in the caller ends the process without waiting for the graph (nothing is published
    # half-written: every file goes through a temp name)
    worker = threading.Thread(target=run, name="qtts-onnx-export", daemon=True)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _torch_export(module, args: tuple, path: str, inputs, outputs, dynamic_axes=None, contrib=False) -> None:
    torch = require("torch", "export", "ONNX export")

    def export() -> None:
        with torch.no_grad():  # grad mode is per thread
            torch.onnx.export(
                module, args, path, opset_version=OPSET, dynamo=False, do_constant_folding=True,
                input_names=list(inputs), output_names=list(outputs), dynamic_axes=dynamic_axes or {},
                custom_opsets={"com.microsoft": 1} if contrib else None,
            )  # fmt: skip

    with quiet_export(), without_ir_lint(torch):
        in_fresh_thread(export)


def export_graph(module, args: tuple, path: str, inputs: list, outputs: list, dynamic_axes: dict,
                 contrib: bool = False) -> None:
    """``torch.onnx.export`` then a deterministic save to ``path``; ``contrib``: the graph emits
    onnxruntime contrib ops (``com.microsoft``)."""
    onnx = require("onnx", "export", "ONNX export")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as tmp:
        raw = os.path.join(tmp, "raw.onnx")
        _torch_export(module, args, raw, inputs, outputs, dynamic_axes, contrib)
        model = onnx.load(raw)
    save_model(model, path)


def save_model(model, path: str) -> None:
    """Save with all weights in ``<name>.data`` next to ``path`` (atomic rename, no timestamps)."""
    onnx = require("onnx", "export", "ONNX export")
    model.producer_name, model.producer_version = "qtts", ""
    for init in model.graph.initializer:  # drop stale external-data pointers from a previous save
        if init.data_location == onnx.TensorProto.EXTERNAL:
            raise InputError(f"{path}: load the model with its external data before saving it")
    directory, name = os.path.split(os.path.abspath(path))
    tmp = tempfile.mkdtemp(dir=directory)
    try:
        onnx.save_model(
            model, os.path.join(tmp, name), save_as_external_data=True, all_tensors_to_one_file=True,
            location=name + ".data", size_threshold=1024,
        )  # fmt: skip
        for fname in (name, name + ".data"):
            src = os.path.join(tmp, fname)
            if os.path.exists(src):
                publish(src, os.path.join(directory, fname))  # umask, not the writer's 0600
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_single_file(module, args: tuple, out: str, inputs: list, outputs: list, metadata: dict) -> str:
    """Fixed shapes to a temp file in the target directory, ``metadata`` (str -> str) added as
    model metadata, then renamed to ``out``."""
    onnx = require("onnx", "export", "ONNX export")
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = temp_beside(out, ".onnx.tmp")  # mode 0666 & ~umask, unlike mkstemp's 0600
    try:
        _torch_export(module, args, tmp, inputs, outputs)
        model = onnx.load(tmp)
        for key, value in metadata.items():
            prop = model.metadata_props.add()
            prop.key, prop.value = key, value
        onnx.save(model, tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


_GATHERED = ("text_embedding", "codec_embedding", "predictor_codec_embedding")


def write_tables(talker, out: str, storage: str = "fp32") -> dict:
    """Embedding and RoPE tables as ``tables/*.npy`` (the gathered embeddings in ``storage``, RoPE
    always fp32); returns name -> path relative to ``out``."""
    if storage not in STORAGES:
        raise InputError(f"unknown table storage '{storage}'; use one of {', '.join(STORAGES)}")
    from .contrib import rope_tables

    cfg = talker.cfg
    cos, sin = rope_tables(min(cfg.max_position_embeddings, 32768), cfg.head_dim, cfg.rope_theta)
    tables = {
        "text_embedding": talker.model.text_embedding.weight.detach().float().numpy(),
        "codec_embedding": talker.model.codec_embedding.weight.detach().float().numpy(),
        "predictor_codec_embedding": np.stack(
            [e.weight.detach().float().numpy() for e in talker.code_predictor.model.codec_embedding]
        ),
        "rope_cos": cos.numpy(),
        "rope_sin": sin.numpy(),
    }
    os.makedirs(os.path.join(out, "tables"), exist_ok=True)
    for name, arr in tables.items():
        save_table(os.path.join(out, "tables", name + ".npy"), arr, storage if name in _GATHERED else "fp32")
    return {name: f"tables/{name}.npy" for name in tables}


def checkpoint_hash(model_dir: str) -> dict:
    """sha256 of every ``*.safetensors`` file of a snapshot (relative path -> hex digest)."""
    digests = {}
    for root, _dirs, files in sorted(os.walk(model_dir)):
        for fname in sorted(files):
            if fname.endswith(".safetensors"):
                path = os.path.join(root, fname)
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        h.update(block)
                digests[os.path.relpath(path, model_dir)] = h.hexdigest()
    return digests


#: rows quantized per block (:func:`quantize_rows`): the block's temporaries stay in cache
QUANT_ROWS = 4096


def quantize_rows(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: ``(int8 data, fp32 scales)`` with ``data * scale ~= arr``.

    Computed :data:`QUANT_ROWS` rows at a time into the result, the bits of the one-pass formula: on the
    151936 x 2048 text table the one-pass numpy made five 1.2 GB temporaries, which left the cache."""
    arr = np.asarray(arr, dtype=np.float32)
    rows = arr.reshape(-1, arr.shape[-1])
    data, scale = np.empty(rows.shape, np.int8), np.empty(len(rows), np.float32)
    for lo in range(0, len(rows), QUANT_ROWS):
        block = rows[lo : lo + QUANT_ROWS]
        absmax = np.abs(block).max(axis=-1)
        s = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
        q = np.divide(block, s[:, None])
        np.clip(np.rint(q, out=q), -127, 127, out=q)
        data[lo : lo + QUANT_ROWS], scale[lo : lo + QUANT_ROWS] = q, s
    return data.reshape(arr.shape), scale.reshape(arr.shape[:-1])


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
