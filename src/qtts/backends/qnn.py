"""``impl: qnn`` generation backend: the torch talker, the code predictor on Qualcomm QNN HTP.

The talker stays in torch (its ONNX graph uses onnxruntime's GroupQueryAttention contrib op,
which QNN cannot take); the code predictor, 74 % of the CPU time per frame, runs as the plain
fixed-shape step of :mod:`qtts.export.qnn` on the QNN execution provider (HTP fp16; emulated on
x86). :class:`PlainPredictor` drives that step from numpy for any runtime with a
``run(feeds) -> (logits, kv)`` callable (QNN here, ExecuTorch in ``scripts/executorch_row.py``).

Plan entry::

    {"code_predictor": {"impl": "qnn", "artifacts": {"main": "predictor_step.onnx"},
                        "options": {"soc_model": "57", "fp16": true}, "precision": "fp16"}}
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ..errors import InputError
from .base import sample_residuals
from .torch import TorchBackend, torch_dtype

log = logging.getLogger(__name__)

SLOTS = 17
MASK_NEG = -1e4


class PlainPredictor:
    """One frame of the code predictor over a fixed-shape step (see :mod:`qtts.export.qnn`).

    ``run(embeds, slot, mask, head, kv) -> (logits [1, vocab], kv_out)`` with numpy in and out;
    ``codec_table [V0, H]`` is the talker's codec embedding (code 0), ``tables [15, V, H]`` the
    predictor's; ``kv_shape`` = ``[layers, 2, kv_heads, 17, head_dim]``.
    """

    def __init__(self, run: Callable, codec_table: np.ndarray, tables: np.ndarray, kv_shape: tuple):
        self._run = run
        self.codec_table = np.ascontiguousarray(codec_table, dtype=np.float32)
        self.tables = np.ascontiguousarray(tables, dtype=np.float32)
        self.kv_shape = tuple(int(d) for d in kv_shape)
        if len(self.kv_shape) != 5 or self.kv_shape[3] != SLOTS:
            raise InputError(
                f"predictor step kv must be [layers, 2, kv_heads, {SLOTS}, head_dim], got {kv_shape}"
            )
        self._slots = np.eye(SLOTS, dtype=np.float32)
        self._masks = np.where(np.tri(SLOTS, dtype=bool), 0.0, MASK_NEG).astype(np.float32)

    def step(self, vec: np.ndarray, pos: int, head: int, kv: np.ndarray):
        x = np.ascontiguousarray(vec, dtype=np.float32).reshape(1, 1, -1)
        return self._run(
            x, self._slots[pos : pos + 1], self._masks[pos : pos + 1], np.array([head], np.int64), kv
        )

    def frame_logits(self, hidden: np.ndarray) -> Callable[[int, int], np.ndarray]:
        """A ``step_logits(j, code)`` callable for :func:`~qtts.backends.base.sample_residuals`."""
        kv = np.zeros(self.kv_shape, np.float32)
        _, kv = self.step(hidden, 0, 0, kv)  # the talker hidden state at slot 0 (its logits unused)

        def step_logits(j: int, code: int) -> np.ndarray:
            nonlocal kv
            vec = self.codec_table[code] if j == 0 else self.tables[j - 1][code]
            logits, kv = self.step(vec, j + 1, j, kv)
            return np.asarray(logits, dtype=np.float32).reshape(-1)

        return step_logits

    def predict_frame(self, hidden, code0: int, params, uniforms) -> np.ndarray:
        return sample_residuals(self.frame_logits(hidden), code0, params, uniforms)


def session_runner(session) -> tuple[Callable, tuple]:
    """(run callable, kv shape) for an onnxruntime session of the plain predictor step."""
    names = ("embeds", "slot", "mask", "head", "kv")
    shapes = {i.name: i.shape for i in session.get_inputs()}
    if set(shapes) != set(names):
        raise InputError(f"not a qtts plain predictor step (inputs {sorted(shapes)}); use `qtts export qnn`")

    def run(*arrays):
        return session.run(["logits", "kv_out"], dict(zip(names, arrays)))

    return run, tuple(shapes["kv"])


class QnnBackend(TorchBackend):
    """Torch talker + QNN code predictor; the predictor runs one frame at a time (not thread safe)."""

    thread_safe = False

    def __init__(self, talker, predictor: PlainPredictor, threads: int | None = None):
        super().__init__(talker, threads=threads)
        self.plain = predictor

    def predict_frame(self, hidden: np.ndarray, code0: int, params, uniforms: np.ndarray) -> np.ndarray:
        return self.plain.predict_frame(hidden, code0, params, uniforms)


def torch_tables(talker) -> tuple[np.ndarray, np.ndarray]:
    """(talker codec embedding [V0, H], predictor codec embeddings [15, V, H]) as fp32 numpy."""
    import torch

    with torch.no_grad():
        codec = talker.model.codec_embedding.weight.float().numpy()
        tables = torch.stack([e.weight for e in talker.code_predictor.model.codec_embedding]).float().numpy()
    return codec, tables


def create(snapshot_dir: str, components: dict, checkpoint=None, dtype: str = "float32", threads=None):
    """Factory for ``impl: qnn`` (:data:`qtts.backends.FACTORIES`): code predictor on QNN, talker torch."""
    from ..qnn import QnnOptions, qnn_session
    from .onnx import _artifact_path

    entry = components.get("code_predictor")
    if entry is None or getattr(entry, "impl", None) != "qnn":
        raise InputError(
            "impl qnn runs the code_predictor only; name it in the plan (the talker stays torch)"
        )
    if checkpoint is None:
        from ..weights import load_checkpoint

        checkpoint = load_checkpoint(snapshot_dir, dtype=torch_dtype(dtype), components=("talker",))
    talker = checkpoint.model.talker
    session = qnn_session(_artifact_path(entry), QnnOptions.from_plan(getattr(entry, "options", None)))
    run, kv_shape = session_runner(session)
    codec, tables = torch_tables(talker)
    return QnnBackend(talker, PlainPredictor(run, codec, tables, kv_shape), threads=threads)
