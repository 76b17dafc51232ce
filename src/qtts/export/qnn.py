"""A plain-op, fixed-shape code-predictor step for NPUs (QNN HTP, ExecuTorch), and its ONNX export.

:class:`PlainPredictorStep` runs **one** vector through the code predictor with a 17-slot KV
cache and an explicit slot: no contrib ops (the ONNX engine's GroupQueryAttention is
onnxruntime-only), no dynamic shapes, no ``Pow`` (the QNN HTP emulator computes
``Pow(-0.0, 2) = -4``; RMSNorm squares with ``x * x`` here). One frame is 16 runs: the talker
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

from ..errors import QttsError, require
from .single_file import export_single_file

log = logging.getLogger(__name__)

OPSET = 17
SLOTS = 17
MASK_NEG = -1e4  # finite: fp16 hardware keeps it, softmax underflows it to 0
INPUTS = ("embeds", "slot", "mask", "head", "kv")
OUTPUTS = ("logits", "kv_out")


def _torch():
    return require("torch", "export", "the NPU predictor export")


def plain_step_class():
    """The torch module class (built lazily so importing this file does not import torch)."""
    torch = _torch()
    from ..model.layers import rope_cos_sin

    def rms(x, w, eps):
        return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))

    class PlainPredictorStep(torch.nn.Module):
        def __init__(self, predictor):
            super().__init__()
            self.p = predictor.float().eval()
            cfg = predictor.cfg
            self.cfg = cfg
            cos, sin = rope_cos_sin(torch.arange(SLOTS), cfg.head_dim, cfg.rope_theta, torch.float32)
            self.register_buffer("cos", cos)  # [17, hd]
            self.register_buffer("sin", sin)
            self.register_buffer("heads", torch.stack([h.weight.detach() for h in predictor.lm_head]))

        def _attn(self, layer, x, cos, sin, slot, mask, kv):
            a, cfg = layer.self_attn, self.cfg
            heads, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            eps = cfg.rms_norm_eps
            q = rms(a.q_proj(x).view(heads, 1, hd), a.q_norm.weight, eps)
            k = rms(a.k_proj(x).view(kvh, 1, hd), a.k_norm.weight, eps)
            v = a.v_proj(x).view(kvh, 1, hd)
            half = hd // 2
            rot = lambda t: torch.cat((-t[..., half:], t[..., :half]), dim=-1)  # noqa: E731
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            sel = slot.view(1, SLOTS, 1)  # write the new row at the one-hot slot
            kc = kv[0] * (1.0 - sel) + k * sel
            vc = kv[1] * (1.0 - sel) + v * sel
            qg = q.reshape(kvh, heads // kvh, hd)
            scores = torch.matmul(qg, kc.transpose(1, 2)) * (hd**-0.5) + mask.view(1, 1, SLOTS)
            out = torch.matmul(torch.softmax(scores, dim=-1), vc).reshape(1, 1, heads * hd)
            return a.o_proj(out), torch.stack([kc, vc])

        def forward(self, embeds, slot, mask, head, kv):
            cfg = self.cfg
            x = self.p.small_to_mtp_projection(embeds)
            cos = torch.matmul(slot, self.cos).view(1, 1, -1)
            sin = torch.matmul(slot, self.sin).view(1, 1, -1)
            new = []
            for i, layer in enumerate(self.p.model.layers):
                h = rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
                o, kvi = self._attn(layer, h, cos, sin, slot, mask, kv[i])
                x = x + o
                h = rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
                m = layer.mlp
                g = m.gate_proj(h)
                x = x + m.down_proj(g * torch.sigmoid(g) * m.up_proj(h))
                new.append(kvi)
            x = rms(x, self.p.model.norm.weight, cfg.rms_norm_eps).view(1, 1, -1)
            w = self.heads[head]  # [1, vocab, hidden]: Gather of the chosen head
            return torch.matmul(x, w.transpose(1, 2)).view(1, -1), torch.stack(new)

    return PlainPredictorStep


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
    """(CodePredictor fp32, talker module) from a snapshot dir, or pass a talker module through."""
    if hasattr(model, "code_predictor"):
        return model.code_predictor.float().eval(), model
    from ..weights import load_checkpoint

    talker = load_checkpoint(str(model), components=("talker",)).model.talker.float().eval()
    return talker.code_predictor, talker


def export_predictor_onnx(model, out: str) -> dict:
    """Export :class:`PlainPredictorStep` to ``out`` (opset 17, TorchScript exporter, fixed shapes)."""
    torch = _torch()
    onnx = require("onnx", "export", "the NPU predictor export")
    predictor, talker = load_predictor(model)
    step = plain_step_class()(predictor).eval()
    args = tuple(torch.from_numpy(a) for a in example_inputs(predictor.cfg, int(talker.cfg.hidden_size)))
    meta = {"slots": SLOTS, "layers": predictor.cfg.num_hidden_layers,
            "kv_heads": predictor.cfg.num_key_value_heads, "head_dim": predictor.cfg.head_dim,
            "vocab": predictor.cfg.vocab_size, "talker_hidden": int(talker.cfg.hidden_size)}  # fmt: skip
    out = export_single_file(step, args, out, INPUTS, OUTPUTS, {"qtts.npu_predictor": json.dumps(meta)})
    ops = sorted({n.op_type for n in onnx.load(out, load_external_data=False).graph.node})
    log.info("exported the plain predictor step to %s (ops: %s)", out, ", ".join(ops))
    return {"path": out, "ops": ops, **meta}


def export_qnn_bundle(model, out_dir: str, codes_length: int = 4, soc_model: str = "57") -> dict:
    """Predictor step + vocoder step ONNX in ``out_dir`` and a ``plan.json`` running both on QNN HTP fp16.

    The talker stays torch (the plan does not name it). Returns {"plan": path, "predictor": report,
    "vocoder": report}.
    """
    from ..plan import PLAN_VERSION
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
        "code_predictor": {"impl": "qnn", "artifacts": {"main": "predictor_step.onnx"},
                           "options": options, "precision": "fp16"},
        "speech_decoder": {"impl": "qnn", "artifacts": {"main": voc_name},
                           "options": options, "precision": "fp16"},
    }  # fmt: skip
    path = os.path.join(out_dir, "plan.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(plan, fh, indent=2)
        fh.write("\n")
    os.replace(path + ".tmp", path)
    return {"plan": path, "predictor": pred, "vocoder": voc}
