"""onnxruntime contrib ops and fixed-shape helpers for the export wrappers (:mod:`qtts.export.graphs`).

Each is a ``torch.autograd.Function`` whose ``forward`` runs the core model's own primitives
(:mod:`qtts.model.layers`), so tracing and parity tests compute the reference, and whose
``symbolic`` emits the fused onnxruntime kernel:

* ``SimplifiedLayerNormalization`` (RMSNorm, fp32 statistics) for every RMSNorm, including the
  per-head q/k norms (the residual Add stays a node of its own: :func:`skip_rms_norm`);
* ``com.microsoft::GroupQueryAttention`` (GQA) with RoPE inside (``do_rotary=1``, rotate-half),
  a ``[B, kv_heads, L, head_dim]`` past/present KV pair per layer, ``seqlens_k = pos + T - 1``
  and ``total_sequence_length = pos + T``. When the runtime binds the *same* buffer to past and
  present (I/O binding), GQA writes only the new slots in place: no KV copy per step. A past
  shorter than ``pos + T`` (the frame graph's caches, empty at the first pass) grows: present =
  past + the new rows;
* ``Reshape`` with a constant ``[0, -1, *tail]`` shape for the per-head reshapes: no shape is
  computed at run time, in the dynamic talker graph or the static frame graph.
"""

from __future__ import annotations

import torch
from torch import nn

from ..model.layers import apply_rope, causal_mask, grouped_attention, rope_angles, rope_inv_freq
from ..model.layers import rms_norm as _rms_norm


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float):
        return _rms_norm(x, weight, eps)

    @staticmethod
    def symbolic(g, x, weight, eps: float):
        return g.op("SimplifiedLayerNormalization", x, weight, axis_i=-1, epsilon_f=eps, stash_type_i=1)


def rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """RMSNorm with the core module's weight/eps, as the onnxruntime contrib op when exported."""
    return _RMSNorm.apply(x, norm.weight, float(norm.eps))


def skip_rms_norm(x: torch.Tensor, skip: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + skip), x + skip)``: a residual Add and the norm that reads it. Two nodes, not
    onnxruntime's fused ``SkipSimplifiedLayerNormalization``: on the 2-core Zen 4 VM the fused kernel
    was no faster (1.74-2.45 against 1.30-2.35 us CPU per pair) and rounds differently
    (docs/history/performance.md, "Fewer nodes"; ``benchmarks/perf/node_cost.py`` measures both)."""
    s = x + skip
    return rms_norm(s, norm), s


class _Reshape(torch.autograd.Function):
    """Reshape keeping the leading (batch, sequence) dims: ONNX ``Reshape`` with a constant
    ``[0, -1, *tail]`` (0 copies the batch dim, -1 is the sequence), so neither a dynamic nor a static graph computes
    its shape at run time (no Shape/Gather/Unsqueeze/Concat chain per reshape)."""

    @staticmethod
    def forward(ctx, x, tail: tuple):
        return x.reshape(*x.shape[:2], *tail)

    @staticmethod
    def symbolic(g, x, tail: tuple):
        return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor([0, -1, *tail], dtype=torch.int64)))


def reshape_tail(x: torch.Tensor, *tail: int) -> torch.Tensor:
    """``x [B, T, ...] -> [B, T, *tail]`` (see :class:`_Reshape`)."""
    return _Reshape.apply(x, tuple(int(d) for d in tail))


class _GQA(torch.autograd.Function):
    """GroupQueryAttention with in-op RoPE over a fixed-size past/present KV buffer."""

    @staticmethod
    def forward(
        ctx, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache, heads: int, kv_heads: int
    ):
        b, t, _ = q.shape
        hd = past_k.shape[-1]
        pos = int(total_len) - t
        cos = torch.cat([cos_cache[pos : pos + t]] * 2, dim=-1)  # half-width tables -> [t, hd]
        sin = torch.cat([sin_cache[pos : pos + t]] * 2, dim=-1)
        q = apply_rope(q.view(b, t, heads, hd).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(b, t, kv_heads, hd).transpose(1, 2), cos, sin)
        v = v.view(b, t, kv_heads, hd).transpose(1, 2)
        if past_k.shape[2] < pos + t:  # a growing cache (the frame graph): present = past + the new rows
            present_k, present_v = torch.cat([past_k[:, :, :pos], k], 2), torch.cat([past_v[:, :, :pos], v], 2)
        else:
            present_k, present_v = past_k.clone(), past_v.clone()
            present_k[:, :, pos : pos + t], present_v[:, :, pos : pos + t] = k, v
        keys, values = present_k[:, :, : pos + t], present_v[:, :, : pos + t]
        out = grouped_attention(q, keys, values, causal_mask(pos, t), hd**-0.5)
        return out.transpose(1, 2).reshape(b, t, heads * hd), present_k, present_v

    @staticmethod
    def symbolic(
        g, q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache, heads: int, kv_heads: int
    ):
        out, pk, pv = g.op(
            "com.microsoft::GroupQueryAttention",
            q, k, v, past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache,
            num_heads_i=heads, kv_num_heads_i=kv_heads, do_rotary_i=1, rotary_interleaved_i=0,
            outputs=3,
        )  # fmt: skip
        out.setType(q.type())
        sizes = past_k.type().varyingSizes()  # the cache length of present may exceed past's (a growing cache)
        pk.setType(past_k.type().with_sizes(sizes[:2] + [None] + sizes[3:]))
        pv.setType(past_v.type().with_sizes(sizes[:2] + [None] + sizes[3:]))
        return out, pk, pv


def rope_tables(max_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin caches ``[max_len, head_dim/2]`` in fp32 (the core model's RoPE angles)."""
    freqs = rope_angles(torch.arange(max_len), rope_inv_freq(head_dim, theta))
    return freqs.cos(), freqs.sin()
