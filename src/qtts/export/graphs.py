"""Tiny export wrappers over the core model (like kokoro's ``KModelForONNX``).

Each wrapper holds references to the core modules' weights (attribute paths == checkpoint keys)
and re-expresses the forward pass with ONNX-friendly, fixed-rank ops; the onnxruntime contrib ops
(RMSNorm, GroupQueryAttention with RoPE and its KV
I/O) and the constant-shape reshapes come from :mod:`qtts.export.contrib`. In torch (tracing,
parity tests) they run the core model's own primitives (:mod:`qtts.model.layers`), so
``wrapper(...)`` equals the core model's ``forward`` up to float rounding; only the attention
kernel and the fused projections are written here.

The decoder stack (:class:`FusedLayer`) leaves each layer's MLP output unsummed: the next norm
adds the residual (:func:`~qtts.export.contrib.skip_rms_norm`), so a layer runs 19 onnxruntime
nodes (4 norms, 2 Adds, 4 MatMul, GQA, 2 Split, 4 Reshape, SiLU, Mul) and no shape arithmetic.

Graphs:

* :class:`TalkerGraph`: ``embeds [1,T,H]`` at explicit start position ``pos`` -> logits and
  final-normed hidden of the **last** position + presents (prefill and decode step are the same
  graph with a dynamic ``T``).
* :class:`PredictorStepGraph`: one code-predictor call (T=2 prefill or T=1 step) -> the hidden
  state and all 15 ``lm_head`` logits as separate outputs (the runtime fetches only head ``j``).
* :class:`PredictorFrameGraph`: the whole frame (prefill + 14 steps, 15 heads) unrolled in one
  graph with in-graph greedy / inverse-CDF top-k/top-p sampling driven by host uniforms.
* :class:`TextProjectionGraph`: ``text_projection`` over host-gathered ``text_embedding`` rows.
* :class:`PlainPredictorStep`: one predictor vector with plain ops only, for NPUs (see
  :mod:`qtts.export.qnn`).
* :class:`PlainTalkerStep`: one talker position with plain ops, a fixed-size KV cache in and out
  and the position as an input (ExecuTorch, :mod:`qtts.export.executorch`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import PREDICTOR_STEPS
from ..model.layers import rope_cos_sin, swiglu
from .contrib import _GQA, reshape_tail, rms_norm, rope_tables, skip_rms_norm

# ---------------------------------------------------------------------------- decoder stack


class FusedLayer(nn.Module):
    """One Qwen3 decoder layer with q/k/v and gate/up projections concatenated (fewer, larger GEMVs)."""

    def __init__(self, layer: nn.Module, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        att, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        w = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight], 0).detach()
        self.qkv = nn.Parameter(w.t().contiguous(), requires_grad=False)  # [H, (h+2kvh)*hd]
        self.o = nn.Parameter(att.o_proj.weight.detach().t().contiguous(), requires_grad=False)
        gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0).detach()
        self.gate_up = nn.Parameter(gu.t().contiguous(), requires_grad=False)
        self.down = nn.Parameter(mlp.down_proj.weight.detach().t().contiguous(), requires_grad=False)
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.q_norm, self.k_norm = att.q_norm, att.k_norm
        self.intermediate = mlp.gate_proj.weight.shape[0]
        self.mid_rotation = None  # the MLP intermediate's HadamardRotation (qtts.export.rotate; signs in up)

    def forward(self, x, skip, past_k, past_v, seqlens_k, total_len, cos, sin):
        """``x + skip`` (``skip``: the previous layer's MLP output, None for the first layer) through
        the layer -> ``(x', mlp_out, present_k, present_v)`` with the layer's output ``x' + mlp_out``
        left unsummed: the next norm adds it (:func:`skip_rms_norm`)."""
        hd, nq, nk = self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        if skip is None:
            h = rms_norm(x, self.input_layernorm)
        else:
            h, x = skip_rms_norm(x, skip, self.input_layernorm)
        qkv = torch.matmul(h, self.qkv)
        q, k, v = qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]
        q = reshape_tail(rms_norm(reshape_tail(q, self.heads, hd), self.q_norm), nq)
        k = reshape_tail(rms_norm(reshape_tail(k, self.kv_heads, hd), self.k_norm), nk)
        att, pk, pv = _GQA.apply(
            q, k, v, past_k, past_v, seqlens_k, total_len, cos, sin, self.heads, self.kv_heads
        )
        h, x = skip_rms_norm(x, torch.matmul(att, self.o), self.post_attention_layernorm)
        gu = torch.matmul(h, self.gate_up)
        gate, up = gu[..., : self.intermediate], gu[..., self.intermediate :]
        act = swiglu(gate, up)
        if self.mid_rotation is not None:
            act = self.mid_rotation.hadamard(act)
        return x, torch.matmul(act, self.down), pk, pv


def fused_layers(layers, cfg) -> nn.ModuleList:
    return nn.ModuleList(
        FusedLayer(layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) for layer in layers
    )


def run_layers(layers, x, pasts, seqlens_k, total_len, cos, sin, norm):
    """The decoder stack, then ``norm`` -> (normed hidden of every position, presents)."""
    presents, skip = [], None
    for i, layer in enumerate(layers):
        x, skip, pk, pv = layer(x, skip, pasts[2 * i], pasts[2 * i + 1], seqlens_k, total_len, cos, sin)
        presents += [pk, pv]
    return skip_rms_norm(x, skip, norm)[0], presents


def kv_names(num_layers: int, prefix: str) -> list[str]:
    """``[f"{prefix}_key_0", f"{prefix}_value_0", ...]`` in graph input/output order."""
    return [f"{prefix}_{kind}_{i}" for i in range(num_layers) for kind in ("key", "value")]


class TalkerGraph(nn.Module):
    """Talker prefill/step: ``(embeds [1,T,H], seqlens_k [1] i32, total_len [] i32, cos, sin, *past)``
    -> ``(logits [1,vocab], hidden [1,H], *present)`` for the last of the ``T`` positions.
    ``rotate``: the Hadamard-rotated weights of :mod:`qtts.export.rotate` (same inputs and outputs)."""

    def __init__(self, talker: nn.Module, rotate: bool = False):
        super().__init__()
        self.cfg = talker.cfg
        self.layers = fused_layers(talker.model.layers, self.cfg)
        self.norm = talker.model.norm
        self.head = nn.Parameter(talker.codec_head.weight.detach().t().contiguous(), requires_grad=False)
        self.rotation = None
        if rotate:
            from .rotate import UnitNorm, reads, rotate_stack

            self.rotation = rotate_stack(self.layers, self.cfg.hidden_size)
            self.head = nn.Parameter(reads(self.head, self.rotation, self.norm.weight), requires_grad=False)
            gain = self.norm.weight.detach().float() * self.rotation.signs  # the inverse's signs, then the gain
            self.register_buffer("gain", gain.clone())
            self.norm = UnitNorm(self.norm)

    def forward(self, embeds, seqlens_k, total_len, cos_cache, sin_cache, *pasts):
        x = embeds if self.rotation is None else self.rotation(embeds)
        h, presents = run_layers(self.layers, x, pasts, seqlens_k, total_len, cos_cache, sin_cache, self.norm)
        if self.rotation is None:
            hidden = h[:, -1]  # [1, H]
            return (torch.matmul(hidden, self.head), hidden, *presents)
        last = h[:, -1:]  # [1, 1, H], rotated and without the final norm's gain
        hidden = (self.rotation.hadamard(last) * self.gain)[:, 0]
        return (torch.matmul(last, self.head)[:, 0], hidden, *presents)


class PredictorStepGraph(nn.Module):
    """One predictor call: ``(embeds [1,T,H_talker], seqlens_k, total_len, cos, sin, *past)``
    -> ``(logits_0 .. logits_14 [1,2048], *present)`` of the last position."""

    def __init__(self, predictor: nn.Module, rotate: bool = False):
        super().__init__()
        self.cfg = predictor.cfg
        self.proj = predictor.small_to_mtp_projection
        self.layers = fused_layers(predictor.model.layers, self.cfg)
        self.norm = predictor.model.norm
        heads = [h.weight.detach().t().contiguous() for h in predictor.lm_head]
        self.rotation = None
        if rotate:
            from .rotate import UnitNorm, reads, rotate_stack

            self.rotation = rotate_stack(self.layers, self.cfg.hidden_size)
            heads = [reads(w, self.rotation, self.norm.weight) for w in heads]
            self.norm = UnitNorm(self.norm)
        self.heads = nn.ParameterList(nn.Parameter(w, requires_grad=False) for w in heads)

    def run(self, embeds, pasts, seqlens_k, total_len, cos_cache, sin_cache):
        """The projection, the (rotated) stack and the final norm -> (normed rows, presents)."""
        x = self.proj(embeds)
        if self.rotation is not None:
            x = self.rotation(x)
        return run_layers(self.layers, x, pasts, seqlens_k, total_len, cos_cache, sin_cache, self.norm)

    def forward(self, embeds, seqlens_k, total_len, cos_cache, sin_cache, *pasts):
        h, presents = self.run(embeds, pasts, seqlens_k, total_len, cos_cache, sin_cache)
        hidden = h[:, -1]
        return (*[torch.matmul(hidden, w) for w in self.heads], *presents)


class _TopK(torch.autograd.Function):
    """Largest ``k`` values (sorted, descending) with ``k`` a runtime input (ONNX TopK's K)."""

    @staticmethod
    def forward(ctx, x, k):
        return torch.topk(x, int(k.reshape(-1)[0]), dim=-1)[0]

    @staticmethod
    def symbolic(g, x, k):
        values, _ = g.op("TopK", x, k, axis_i=-1, largest_i=1, sorted_i=1, outputs=2)
        return values


def pick_in_graph(logits, u, temperature, top_k, top_p, do_sample):
    """:func:`qtts.engine.generate.sample` for one row of predictor logits, inside the graph.

    Greedy: argmax of the raw logits. Sampling: temperature -> top-k (ties kept) -> top-p (HF:
    drop the low tail whose cumulative probability is <= 1 - p) -> softmax -> the id whose
    interval of the cumulative distribution **in id order** contains ``u`` (float64 cumsum), so
    the same uniform picks the same id as the numpy sampler. ``logits [1,V]``, ``u [1]``,
    ``temperature [1]``, ``top_k [1] int64`` (1..V), ``top_p [1]``, ``do_sample [1] bool`` -> ``[1] int64``;
    logits ``[1, 1, V]`` give ``[1, 1]`` (the frame graph's passes keep that rank: no reshapes).
    """
    vocab = int(logits.shape[-1])
    greedy = torch.argmax(logits, dim=-1)
    scores = logits / temperature
    ranked = _TopK.apply(scores, top_k)  # [1, k] descending
    p_desc = torch.softmax(ranked, dim=-1)
    keep = torch.cumsum(p_desc, dim=-1) - p_desc < top_p  # the top id always stays (top_p > 0)
    inf = torch.tensor(float("inf"))
    threshold = torch.min(torch.where(keep, ranked, inf), dim=-1, keepdim=True)[0]
    scores = torch.where(scores < threshold, -inf, scores)
    cdf = torch.cumsum(torch.softmax(scores, dim=-1).double(), dim=-1)
    n = torch.sum((cdf <= u.double() * cdf[..., -1:]).to(torch.int64), dim=-1)
    sampled = torch.clamp(n, max=vocab - 1)
    return torch.where(do_sample, sampled, greedy)


class PredictorFrameGraph(nn.Module):
    """A whole frame: ``(hidden [1,H], code0 [1] i64, uniforms [15], temperature [1], top_k [1] i64,
    top_p [1], do_sample [1] bool) -> (codes [15] i64, logits [15, vocab])``. The 17-slot caches live
    inside the graph; the runtime fetches only ``codes``, ``qtts verify plan`` the logits too."""

    def __init__(self, talker: nn.Module, max_len: int = PREDICTOR_STEPS + 2, table_dtype=None,
                 rotate: bool = False):  # fmt: skip
        """``table_dtype``: storage of the in-graph codec tables (fp32 default; float16 halves them,
        each gathered row is cast back to fp32); ``rotate``: :mod:`qtts.export.rotate`."""
        super().__init__()
        predictor = talker.code_predictor
        self.cfg = cfg = predictor.cfg
        self.step = PredictorStepGraph(predictor, rotate=rotate)
        dtype = table_dtype or torch.float32
        self.codec0 = nn.Parameter(talker.model.codec_embedding.weight.detach().to(dtype), requires_grad=False)
        self.tables = nn.ParameterList(
            nn.Parameter(e.weight.detach().to(dtype), requires_grad=False) for e in predictor.model.codec_embedding
        )
        cos, sin = rope_tables(max_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.max_len = max_len

    def forward(self, hidden, code0, uniforms, temperature, top_k, top_p, do_sample):
        cfg, step = self.cfg, self.step
        shape = (1, cfg.num_key_value_heads, 0, cfg.head_dim)  # empty caches: each GQA returns past + its rows
        pasts = [torch.zeros(shape) for _ in range(2 * cfg.num_hidden_layers)]
        x = torch.stack([hidden, self.codec0[code0].float()], dim=1)  # [1, 2, H_talker]
        u = uniforms.double()  # one Cast for all passes
        codes, heads, pos = [], [], 0
        for j in range(PREDICTOR_STEPS):
            t = 2 if j == 0 else 1  # python ints: every pass's positions are static (no Shape ops)
            seqlens = torch.tensor([pos + t - 1], dtype=torch.int32)
            total = torch.tensor(pos + t, dtype=torch.int32)
            h, pasts = step.run(x, pasts, seqlens, total, self.cos, self.sin)
            logits = torch.matmul(h[:, -1:] if t > 1 else h, step.heads[j])  # [1, 1, vocab]
            code = pick_in_graph(logits, u[j : j + 1], temperature, top_k, top_p, do_sample)  # [1, 1]
            codes.append(code)
            heads.append(logits)
            pos += t
            if j < PREDICTOR_STEPS - 1:
                x = self.tables[j][code].float()  # [1, 1, H_talker]
        # codes [15]; logits [15, vocab] (qtts verify plan)
        return torch.cat(codes).reshape(PREDICTOR_STEPS), torch.cat(heads).reshape(PREDICTOR_STEPS, -1)


class TextProjectionGraph(nn.Module):
    """``text_projection`` (fc1 -> SiLU -> fc2) over ``rows [n, text_hidden]`` -> ``[n, H]``."""

    def __init__(self, talker: nn.Module):
        super().__init__()
        self.proj = talker.text_projection

    def forward(self, rows):
        return self.proj(rows)


def plain_attention(attn, x, cos, sin, slot, mask, kv, cfg):
    """One new row through ``attn`` over a fixed ``[2, kv_heads, S, hd]`` cache with plain ops: the
    row is written at the one-hot ``slot [1, S]``, ``mask [1, S]`` is additive -> (out, new cache)."""
    slots = int(slot.shape[-1])
    q, k, v = (t[0] for t in attn.qkv(x, cos, sin, shape=(1, 1)))  # [heads, 1, hd], [kvh, 1, hd] x2
    sel = slot.view(1, slots, 1)
    kc = kv[0] * (1.0 - sel) + k * sel
    vc = kv[1] * (1.0 - sel) + v * sel
    heads, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim  # python ints: no Shape
    qg = q.reshape(kvh, heads // kvh, hd)
    scores = torch.matmul(qg, kc.transpose(1, 2)) * (hd**-0.5) + mask.view(1, 1, slots)
    out = torch.matmul(torch.softmax(scores, dim=-1), vc).reshape(1, 1, heads * hd)
    return attn.o_proj(out), torch.stack([kc, vc])


class PlainPredictorStep(nn.Module):
    """One vector through the predictor with plain, fixed-shape ops (QNN HTP, ExecuTorch).

    ``(embeds [1,1,H_talker], slot [1,17] one-hot, mask [1,17] additive, head [1] int64,
    kv [layers, 2, kv_heads, 17, head_dim]) -> (logits [1, vocab], kv_out)``. Norms, RoPE, the
    q/k projections and the MLP are the core modules'; only the attention kernel differs: the new
    row is written at the one-hot slot and the mask is an input (no contrib ops, no dynamic shapes).
    """

    def __init__(self, predictor, slots: int = PREDICTOR_STEPS + 2):
        super().__init__()
        self.p = predictor.float().eval()
        cfg = self.cfg = predictor.cfg
        cos, sin = rope_cos_sin(torch.arange(slots), cfg.head_dim, cfg.rope_theta, torch.float32)
        self.register_buffer("cos", cos)  # [17, hd]
        self.register_buffer("sin", sin)
        self.register_buffer("heads", torch.stack([h.weight.detach() for h in predictor.lm_head]))
        self.slots = slots

    def forward(self, embeds, slot, mask, head, kv):
        x = self.p.small_to_mtp_projection(embeds)
        cos = torch.matmul(slot, self.cos).view(1, 1, -1)
        sin = torch.matmul(slot, self.sin).view(1, 1, -1)
        new = []
        for i, layer in enumerate(self.p.model.layers):
            o, kvi = plain_attention(layer.self_attn, layer.input_layernorm(x), cos, sin, slot, mask, kv[i], self.cfg)
            x = x + o
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            new.append(kvi)
        x = self.p.model.norm(x).view(1, 1, -1)
        w = self.heads[head]  # [1, vocab, hidden]: Gather of the chosen head
        return torch.matmul(x, w.transpose(1, 2)).view(1, -1), torch.stack(new)


class PlainTalkerStep(nn.Module):
    """One talker position with plain, fixed-shape ops (ExecuTorch): ``(embeds [1,1,H], pos [1]
    int64, kv [layers, 2, kv_heads, max_len, head_dim]) -> (logits [1, vocab], hidden [1, H], kv_out)``.

    ``pos`` selects the RoPE row and the cache slot written (one-hot ``arange == pos``) and masks
    the slots after it (-1e4); ``hidden`` is after the final norm (what the predictor gets).
    """

    def __init__(self, talker, max_len: int, mask_neg: float = -1e4):
        super().__init__()
        self.t = talker.float().eval()
        cfg = self.cfg = talker.cfg
        cos, sin = rope_cos_sin(torch.arange(max_len), cfg.head_dim, cfg.rope_theta, torch.float32)
        self.register_buffer("cos", cos)  # [L, hd]
        self.register_buffer("sin", sin)
        self.register_buffer("slots", torch.arange(max_len, dtype=torch.int64).view(1, max_len))
        self.mask_neg = float(mask_neg)

    def forward(self, embeds, pos, kv):
        slot = (self.slots == pos.view(1, 1)).to(torch.float32)  # [1, L] one-hot
        mask = torch.where(self.slots <= pos.view(1, 1), 0.0, self.mask_neg)
        cos = torch.matmul(slot, self.cos).view(1, 1, -1)
        sin = torch.matmul(slot, self.sin).view(1, 1, -1)
        x, new = embeds, []
        for i, layer in enumerate(self.t.model.layers):
            o, kvi = plain_attention(layer.self_attn, layer.input_layernorm(x), cos, sin, slot, mask, kv[i], self.cfg)
            x = x + o
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            new.append(kvi)
        hidden = self.t.model.norm(x).view(1, -1)
        return self.t.codec_head(hidden), hidden, torch.stack(new)

