"""Qwen3 building blocks shared by the talker and the code predictor.

Pure torch. Numerics follow the official implementation (``qwen_tts`` 0.1.1 on transformers
4.57.3):

* RMSNorm: normalise in float32, cast back to the input dtype, then multiply by the weight.
  The functional pieces (:func:`rms_norm`, :func:`apply_rope`, :func:`swiglu`,
  :func:`grouped_attention`) are what the export graphs (``qtts.export.graphs``,
  ``qtts.export.qnn``) reuse; they rewrite only the attention kernel and the cache I/O.
* RoPE: rotate-half convention, ``inv_freq = theta^(-2i/d)``, cos/sin computed in float32 and
  cast to the activation dtype. The talker's interleaved M-RoPE with identical t/h/w position
  streams (always the case for TTS) is exactly this plain 1-D RoPE.
* Attention: GQA (kv head j serves q heads j*g .. j*g+g-1), per-head q/k RMSNorm before RoPE,
  no biases, scale ``head_dim^-0.5``, softmax in float32.

KV cache: one tensor per stack, ``[num_layers, 2, batch, num_kv_heads, max_len, head_dim]``.
A call with ``T`` new vectors at start position ``pos`` writes slots ``pos .. pos+T-1`` (in
place) and attends causally to slots ``0 .. pos+T-1``; the cache is returned and callers
always use the returned tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fp32(x: torch.Tensor) -> torch.Tensor:
    """x in float32; no Cast node when it already is (keeps exported graphs clean)."""
    return x if x.dtype == torch.float32 else x.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32, cast back, scale. Squares with ``x * x`` (bit-equal to ``pow(2)`` in torch;
    no ``Pow`` in exported graphs, which QNN HTP gets wrong for -0.0)."""
    h = fp32(x)
    h = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + eps)
    return weight * (h if x.dtype == torch.float32 else h.to(x.dtype))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """``theta^(-2i/head_dim)`` for i in 0..head_dim/2-1, float32 (same formula as HF 'default').

    The one definition: the talker, the predictor, the vocoder transformer and every export use it.
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponent)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``[T, head_dim/2]`` fp32 angles ``pos * inv_freq`` for integer ``positions [T]``."""
    return positions.float()[:, None] * inv_freq[None, :]


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[T, head_dim]`` for integer ``positions [T]`` (computed in fp32)."""
    freqs = rope_angles(positions, rope_inv_freq(head_dim, theta, device=positions.device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LayerScale(nn.Module):
    """Per-channel residual-branch scale (speech-tokenizer transformers): key ``scale`` [dim]."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, hd]; cos/sin: [T, hd]."""
    return x * cos + rotate_half(x) * sin


def causal_mask(pos: int, t: int, device=None) -> torch.Tensor | None:
    """Boolean mask ``[t, pos+t]`` (True = attend), or None when plain causal/full attention works."""
    if t == 1:
        return None  # one query attends to every cached slot 0..pos
    q = torch.arange(t, device=device)[:, None] + pos
    k = torch.arange(pos + t, device=device)[None, :]
    return k <= q


class Attention(nn.Module):
    """Qwen3 attention projections (q/k RMSNorm when ``eps`` is given; the speech tokenizer's
    transformers have none) and the talker/predictor kernel over the static KV cache."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float | None = None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if eps is not None else nn.Identity()
        self.k_norm = RMSNorm(head_dim, eps) if eps is not None else nn.Identity()

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, shape: tuple[int, int] | None = None):
        """``x [B, T, H]`` -> rotated q ``[B, heads, T, hd]``, k, v ``[B, kvh, T, hd]`` (cos/sin ``[T, hd]``).

        ``shape``: (B, T) as python ints for fixed-shape graphs (no Shape nodes when traced).
        """
        b, t = shape or x.shape[:2]
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, hd]
        sin: torch.Tensor,
        kv: torch.Tensor,  # [2, B, kvh, max_len, hd] (this layer's slice of the stack cache)
        pos: int,
        mask: torch.Tensor | None,  # [T, pos+T] bool or None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        kv[0, :, :, pos : pos + t] = k
        kv[1, :, :, pos : pos + t] = v
        out = grouped_attention(q, kv[0, :, :, : pos + t], kv[1, :, :, : pos + t], mask, self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


def attend_rows(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kvs: list,
                positions: list[int]) -> torch.Tensor:
    """One new vector per row, each row with its own cache and position (continuous batching).

    ``x [B, 1, H]``, ``cos/sin [B, 1, 1, hd]`` (row b at ``positions[b]``), ``kvs[b]`` = row b's
    layer cache ``[2, 1, kvh, max_len, hd]``. The projections run on all rows at once; each row
    attends over exactly its own ``0 .. pos`` slots, the same shapes as a one-stream step.
    """
    b = x.shape[0]
    q, k, v = attn.qkv(x, cos, sin)  # [B, heads, 1, hd], [B, kvh, 1, hd] x2
    outs = []
    for i, (kv, pos) in enumerate(zip(kvs, positions)):
        kv[0, :, :, pos : pos + 1] = k[i : i + 1]
        kv[1, :, :, pos : pos + 1] = v[i : i + 1]
        keys, values = kv[0, :, :, : pos + 1], kv[1, :, :, : pos + 1]
        outs.append(grouped_attention(q[i : i + 1], keys, values, None, attn.head_dim**-0.5))
    out = torch.cat(outs).transpose(1, 2).reshape(b, 1, attn.heads * attn.head_dim)
    return attn.o_proj(out)


def grouped_attention(q, k, v, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """GQA without repeating K/V: ``q [B, heads, T, hd]``, ``k/v [B, kvh, S, hd]`` -> ``[B, heads, T, hd]``.

    Query head h uses kv head ``h // (heads // kvh)`` (the official ``repeat_kv`` order), so the
    q heads of one kv head are folded into its row dimension. Eager numerics: fp32 softmax of
    the scaled scores, masked slots get the dtype's minimum.
    """
    b, heads, t, hd = q.shape
    kvh = k.shape[1]
    groups = heads // kvh
    qg = q.reshape(b, kvh, groups * t, hd)  # rows ordered (group, t)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [B, kvh, groups*T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask.repeat(groups, 1), torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).view(b, heads, t, hd)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The Qwen3 MLP's gate: ``silu(gate) * up``."""
    return F.silu(gate) * up


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        """``cfg``: a TalkerConfig or PredictorConfig (hidden/intermediate/heads/kv heads/head_dim/eps)."""
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        )
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv, pos: int, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def run_stack_rows(layers: nn.ModuleList, norm: RMSNorm, x: torch.Tensor, positions: list[int],
                   caches: list[torch.Tensor], cfg) -> torch.Tensor:
    """One step for ``B`` streams: ``x [B, 1, H]``, row b at ``positions[b]`` with its own stack cache
    ``caches[b]`` (``[layers, 2, 1, kvh, max_len, hd]``, written in place) -> final-normed ``[B, 1, H]``."""
    for cache, pos in zip(caches, positions):
        if pos < 0 or pos + 1 > cache.shape[4]:
            raise ValueError(f"position {pos} does not fit a KV cache of {cache.shape[4]} slots")
    # per-row tables from the same call as a one-stream step, so every row's angles are identical
    tables = [rope_cos_sin(torch.arange(p, p + 1, device=x.device), cfg.head_dim, cfg.rope_theta, x.dtype)
              for p in positions]  # fmt: skip
    cos = torch.stack([c for c, _ in tables])[:, None]  # [B, 1, 1, hd]
    sin = torch.stack([s for _, s in tables])[:, None]
    for i, layer in enumerate(layers):
        h = layer.input_layernorm(x)
        x = x + attend_rows(layer.self_attn, h, cos, sin, [c[i] for c in caches], positions)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return norm(x)


def new_kv_cache(cfg, max_len: int, batch: int = 1, dtype=None, device=None) -> torch.Tensor:
    """Zeroed cache ``[num_layers, 2, batch, kv_heads, max_len, head_dim]`` for a stack described by ``cfg``."""
    shape = (cfg.num_hidden_layers, 2, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
    return torch.zeros(shape, dtype=dtype or torch.float32, device=device)


def run_stack(
    layers: nn.ModuleList, norm: RMSNorm, x: torch.Tensor, pos: int, cache: torch.Tensor, cfg
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run decoder layers + final norm on ``x [B,T,H]`` at start position ``pos``; returns (hidden, cache)."""
    t = x.shape[1]
    pos = int(pos)
    if pos < 0 or pos + t > cache.shape[4]:
        raise ValueError(f"positions {pos}..{pos + t - 1} do not fit a KV cache of {cache.shape[4]} slots")
    positions = torch.arange(pos, pos + t, device=x.device)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, x.dtype)
    mask = causal_mask(pos, t, device=x.device)
    for i, layer in enumerate(layers):
        x = layer(x, cos, sin, cache[i], pos, mask)
    return norm(x), cache
