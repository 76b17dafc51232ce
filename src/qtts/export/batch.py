"""Batch graphs for continuous batching (:mod:`qtts.engine.batching`), written beside the one-stream graphs.

* talker: the same :class:`~qtts.export.graphs.TalkerGraph` with a dynamic batch axis:
  ``embeds [B,T,H]``, ``seqlens_k [B]`` (each row's own last position), per-layer past/present
  ``[B, kv_heads, kv_len, head_dim]``. The runtime binds rows of one KV pool as both past and
  present, so GroupQueryAttention writes each row's new slot in place and attends over exactly
  that row's own length. Batch 1 with ``T`` > 1 is a joining stream's prefill into its pool row.
* predictor: :class:`PredictorFrameBatchGraph`, a whole frame (15 steps + sampling) for ``B``
  streams. The sampling parameters are one set per call (the runtime groups rows that share them:
  per-row ``top_k`` would change the shapes the sampler reduces over, and with them the rounding);
  ``do_sample`` and the uniforms are per row.

Each row computes exactly what the one-stream graphs compute for it (same kernels, same reduction
lengths); tests/engine/test_batching.py checks the codes against streams run alone.
"""

from __future__ import annotations

import functools
import os

import torch

from ..config import PREDICTOR_STEPS
from .contrib import rope_tables
from .graphs import PredictorFrameGraph, TalkerGraph, kv_names, pick_in_graph
from .write import export_graph

PREDICTOR_INPUTS = ["hidden", "code0", "uniforms", "temperature", "top_k", "top_p", "do_sample"]


class PredictorFrameBatchGraph(PredictorFrameGraph):
    """``(hidden [B,H], code0 [B] i64, uniforms [B,15], temperature [1], top_k [1] i64, top_p [1],
    do_sample [B] bool) -> codes [B,15] i64``; every row runs the one-stream frame graph's ops."""

    def forward(self, hidden, code0, uniforms, temperature, top_k, top_p, do_sample):
        cfg, step = self.cfg, self.step
        rows = torch.zeros_like(code0, dtype=torch.float32).view(-1, 1, 1, 1)  # [B,1,1,1], B dynamic
        past = rows.expand(-1, cfg.num_key_value_heads, self.max_len, cfg.head_dim)
        pasts = [past for _ in range(2 * cfg.num_hidden_layers)]
        x = torch.stack([hidden, self.codec0[code0].float()], dim=1)  # [B, 2, H_talker]
        codes, pos = [], 0
        for j in range(PREDICTOR_STEPS):
            t = x.shape[1]
            seqlens = torch.zeros_like(code0, dtype=torch.int32) + (pos + t - 1)
            total = torch.tensor(pos + t, dtype=torch.int32)
            h, pasts = step.run(x, pasts, seqlens, total, self.cos, self.sin)
            logits = torch.matmul(h[:, -1], step.heads[j])
            code = pick_in_graph(logits, uniforms[:, j : j + 1], temperature, top_k, top_p, do_sample)
            codes.append(code)
            pos += t
            if j < PREDICTOR_STEPS - 1:
                x = self.tables[j][code].float()[:, None, :]  # [B, 1, H_talker]
        return torch.stack(codes, dim=1)


def export_talker_batch(talker, path: str, rotate: bool = False) -> dict:
    """The talker graph with a dynamic batch axis; returns its manifest description."""
    cfg = talker.cfg
    n, b, t, kv_len = cfg.num_hidden_layers, 2, 1, 8
    cos, sin = rope_tables(kv_len, cfg.head_dim, cfg.rope_theta)
    past = [torch.zeros(b, cfg.num_key_value_heads, kv_len, cfg.head_dim) for _ in range(2 * n)]
    args = (torch.zeros(b, t, cfg.hidden_size), torch.tensor([3, 5], dtype=torch.int32),
            torch.tensor(6, dtype=torch.int32), cos, sin, *past)  # fmt: skip
    inputs = ["embeds", "seqlens_k", "total_len", "cos_cache", "sin_cache", *kv_names(n, "past")]
    presents = kv_names(n, "present")
    dyn = {"embeds": {0: "B", 1: "T"}, "seqlens_k": {0: "B"}, "cos_cache": {0: "kv_len"},
           "sin_cache": {0: "kv_len"}, "logits": {0: "B"}, "hidden": {0: "B"}}  # fmt: skip
    dyn.update({name: {0: "B", 2: "kv_len"} for name in inputs[5:] + presents})
    graph = TalkerGraph(talker, rotate=rotate).eval()
    export_graph(graph, args, path, inputs, ["logits", "hidden", *presents], dyn, contrib=True)
    return {"inputs": inputs[:5] + [f"past_{{key,value}}_0..{n - 1}"], "outputs": ["logits", "hidden"],
            "kv": ["B", cfg.num_key_value_heads, "kv_len", cfg.head_dim], "layers": n}  # fmt: skip


def export_predictor_batch(talker, path: str, table_dtype=None, rotate: bool = False) -> dict:
    """The fused predictor frame for ``B`` streams (its codec tables in ``table_dtype``, as the
    one-stream frame graph's); returns its manifest description."""
    b, hidden = 2, talker.cfg.hidden_size
    args = (torch.zeros(b, hidden), torch.zeros(b, dtype=torch.int64), torch.zeros(b, PREDICTOR_STEPS),
            torch.ones(1), torch.ones(1, dtype=torch.int64), torch.ones(1), torch.zeros(b, dtype=torch.bool))  # fmt: skip
    dyn = {
        "hidden": {0: "B"},
        "code0": {0: "B"},
        "uniforms": {0: "B"},
        "do_sample": {0: "B"},
        "codes": {0: "B"},
    }
    graph = PredictorFrameBatchGraph(talker, table_dtype=table_dtype, rotate=rotate).eval()
    export_graph(graph, args, path, PREDICTOR_INPUTS, ["codes"], dyn, contrib=True)
    return {"inputs": PREDICTOR_INPUTS, "outputs": ["codes"]}


def export_batch_graphs(talker, out: str, precision: dict, quantize, table_dtype=None,
                        rotate: bool = False) -> dict:  # fmt: skip
    """Both batch graphs into ``out``, quantized like the one-stream graphs; ``precision``: component ->
    precision label (in the file name), ``quantize(path, component) -> settings``. Returns component -> {artifact, io, quantization}."""
    written = {}
    predictor = functools.partial(export_predictor_batch, table_dtype=table_dtype, rotate=rotate)
    talker_fn = functools.partial(export_talker_batch, rotate=rotate)
    for name, export in (("talker", talker_fn), ("predictor", predictor)):
        if name not in precision:
            continue
        fname = f"{name}.batch.{precision[name]}.onnx"
        io = export(talker, os.path.join(out, fname))
        written[name] = {
            "artifact": fname,
            "io": io,
            "quantization": quantize(os.path.join(out, fname), name),
        }
    return written
