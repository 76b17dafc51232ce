"""A plain-op, fixed-shape predictor step for NPUs (QNN HTP, ExecuTorch), and its ONNX export.

:class:`~qtts.export.graphs.PlainPredictorStep` runs **one** vector through the predictor with a 17-slot KV
cache and an explicit slot: no contrib ops (the ONNX engine's GroupQueryAttention is
onnxruntime-only), no dynamic shapes, no ``Pow`` (the QNN HTP emulator computes
``Pow(-0.0, 2) = -4``; RMSNorm squares with ``x * x``). One frame is 16 runs: the talker
hidden state at slot 0, the code-0 embedding at slot 1 (-> head 0), then codebook j's embedding
at slot j + 1 (-> head j). The host feeds:

* ``embeds [1, 1, H_talker]`` (embedding rows are numpy tables on the host),
* ``slot [1, 17]`` one-hot of the position (selects the RoPE row and the cache slot written),
* ``mask [1, 17]`` additive attention mask (0 for slots 0..pos, -1e4 after),
* ``head [1]`` int64: which of the 15 ``lm_head`` matrices gives the logits,
* ``kv [layers, 2, kv_heads, 17, head_dim]``; outputs ``logits [1, vocab]`` and ``kv_out``.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ..backends.qnn import MASK_NEG, SLOTS, STEP_INPUTS, STEP_OUTPUTS
from ..errors import QttsError, require
from .write import export_single_file

log = logging.getLogger(__name__)


def plain_step(predictor):
    """The :class:`~qtts.export.graphs.PlainPredictorStep` of a predictor module (fp32, eval)."""
    from .graphs import PlainPredictorStep

    return PlainPredictorStep(predictor, SLOTS).eval()


def example_inputs(cfg, talker_hidden: int):
    """Inputs for tracing: slot 1 of a zero cache (numpy arrays)."""
    slot = np.zeros((1, SLOTS), np.float32)
    slot[0, 1] = 1.0
    mask = np.full((1, SLOTS), MASK_NEG, np.float32)
    mask[0, :2] = 0.0
    kv = np.zeros((cfg.num_hidden_layers, 2, cfg.num_key_value_heads, SLOTS, cfg.head_dim), np.float32)
    return (
        np.zeros((1, 1, talker_hidden), np.float32), slot, mask, np.zeros(1, np.int64), kv,
    )  # fmt: skip


def load_predictor(model):
    """(predictor fp32, talker module) from a snapshot dir, or pass a talker module through."""
    if hasattr(model, "code_predictor"):
        return model.code_predictor.float().eval(), model
    from ..weights import load_checkpoint

    talker = load_checkpoint(str(model), components=("talker",)).model.talker.float().eval()
    return talker.code_predictor, talker


def export_predictor_onnx(model, out: str) -> dict:
    """Export the plain predictor step to ``out`` (opset 17, TorchScript exporter, fixed shapes)."""
    torch = require("torch", "export", "the NPU predictor export")
    onnx = require("onnx", "export", "the NPU predictor export")
    predictor, talker = load_predictor(model)
    step = plain_step(predictor)
    args = tuple(torch.from_numpy(a) for a in example_inputs(predictor.cfg, int(talker.cfg.hidden_size)))
    meta = {"slots": SLOTS, "layers": predictor.cfg.num_hidden_layers,
            "kv_heads": predictor.cfg.num_key_value_heads, "head_dim": predictor.cfg.head_dim,
            "vocab": predictor.cfg.vocab_size, "talker_hidden": int(talker.cfg.hidden_size)}  # fmt: skip
    out = export_single_file(step, args, out, STEP_INPUTS, STEP_OUTPUTS, {"qtts.npu_predictor": json.dumps(meta)})
    ops = sorted({n.op_type for n in onnx.load(out, load_external_data=False).graph.node})
    log.info("exported the plain predictor step to %s (ops: %s)", out, ", ".join(ops))
    return {"path": out, "ops": ops, **meta}


def export_qnn_bundle(model, out_dir: str, codes_length: int = 4, soc_model: str = "57") -> dict:
    """Predictor step + vocoder step ONNX in ``out_dir`` and a ``plan.json`` running both on QNN HTP fp16.

    The talker stays torch (the plan does not name it). Returns {"plan": path, "predictor": report,
    "vocoder": report}.
    """
    from ..plans.plan import MANIFEST, PLAN, PLAN_VERSION, source_info, write_json
    from .vocoder import export_vocoder_onnx

    out_dir = os.path.abspath(out_dir)
    if not hasattr(model, "code_predictor"):  # a bad snapshot path fails before anything is created
        from ..weights import resolve_snapshot

        model = resolve_snapshot(str(model))
    os.makedirs(out_dir, exist_ok=True)
    pred = export_predictor_onnx(model, os.path.join(out_dir, "predictor_step.onnx"))
    voc_name = f"vocoder_step{int(codes_length)}.onnx"
    voc = export_vocoder_onnx(model, int(codes_length), os.path.join(out_dir, voc_name))
    pows = [r["path"] for r in (pred, voc) if "Pow" in r.get("ops", ()) or "Pow" in r.get("risky_ops", ())]
    if pows:  # the HTP emulator computes Pow(-0.0, 2) = -4: such a graph decodes garbage on QNN
        raise QttsError(
            f"{', '.join(pows)}: the graph has Pow, which QNN HTP gets wrong for -0.0; square with x * x"
        )
    options = {"soc_model": str(soc_model), "fp16": True}
    plan = {
        "version": PLAN_VERSION,
        "predictor": {"impl": "qnn", "artifacts": {"main": "predictor_step.onnx"},
                      "options": options, "precision": "fp16"},
        "vocoder": {"impl": "qnn", "artifacts": {"main": voc_name}, "options": options, "precision": "fp16"},
    }  # fmt: skip
    if isinstance(model, str):  # a snapshot: record where the bundle comes from
        write_json(os.path.join(out_dir, MANIFEST), {"source": source_info(model), "precision": {
            "predictor": "fp16", "vocoder": "fp16"}})  # fmt: skip
    write_json(os.path.join(out_dir, PLAN), plan)
    return {"plan": os.path.join(out_dir, PLAN), "predictor": pred, "vocoder": voc}
