"""Hadamard rotations of the talker and predictor graphs (``--repair rotate``), QuaRot-style.

Trained LLMs carry a few outlier channels (norm gains and activations 10-100x the rest) and
heavy-tailed weight rows. A 4- or 8-bit block quantizer spends its levels on those few values and
rounds the rest coarsely, and the kernel's int8 activations (``accuracy_level`` 4) do the same per
block of activations. An orthogonal rotation ``Q`` of the space a weight reads spreads every outlier
over all channels of its block (and averages heavy tails toward a Gaussian) while computing the same
function in fp32:

* **residual stream** (size ``H``): ``x' = x Q``. Each RMSNorm commutes with ``Q`` once its gain is
  folded into the projections that read it (``||x Q|| = ||x||``), so a projection reading the normed
  stream becomes ``W' = Q^T diag(g) W`` (q/k/v, gate/up, the heads) and one writing into the stream
  ``W' = W Q`` (o, down). The graph rotates its input embeddings once on entry; the talker hands the
  predictor its hidden state rotated back (``x' Q^T``, then the final norm's gain): every input and
  output of the graphs, the KV caches included (keys and values are unchanged), stays as it was.
* **MLP intermediate** (size ``I``): ``silu(gate) * up`` is rotated by ``R`` before ``down``, whose
  weight becomes ``R^T down``: outlier channels of the intermediate (large ``up_proj`` rows) no
  longer dominate the down projection's activation blocks.

``Q = diag(s) H / sqrt(n)`` with fixed random signs ``s`` (a seeded generator: exports are
deterministic) and ``H`` the Sylvester-Hadamard matrix, block diagonal over blocks of the largest
power of two dividing ``n`` (1024 for 3072). In the graph a block is applied as two small matrix
products (``H_p = H_a (x) H_b``, ``p = a b``: ``X -> H_a X H_b`` on each ``[a, b]`` view of the row),
four nodes (two reshapes) and ~2 ``n sqrt(p)`` multiply-adds per row, no stored ``n x n`` matrix; the
quantizer keeps these constants in fp32 (their names hold ``rotation``). The MLP rotation's signs are
folded into the ``up_proj`` columns (``silu(gate) * up`` is linear in ``up``), the hidden output's into
the final norm's gain: only the input rotation has a ``Mul`` of its own.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..errors import InputError
from .contrib import reshape_tail

SEED = 20261202  # the signs of every rotation derive from it and the rotated size


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def factors(n: int) -> tuple[int, int, int]:
    """``n = m * a * b`` with ``a * b`` the largest power of two dividing ``n`` and ``a <= b``."""
    p = n & -n
    if p < 2:
        raise InputError(f"no Hadamard rotation for an odd size {n}; export this checkpoint without --repair rotate")
    a = 1 << (p.bit_length() - 1) // 2
    return n // p, a, p // a


class HadamardRotation(nn.Module):
    """``x [B, T, n] -> x Q`` (:meth:`forward`) and ``x Q^T`` (:meth:`inverse`); see the module doc."""

    def __init__(self, n: int, seed: int = SEED):
        super().__init__()
        self.n = n
        self.m, a, b = factors(n)
        signs = np.random.default_rng(seed + n).integers(0, 2, n) * 2 - 1
        self.register_buffer("signs", torch.tensor(signs, dtype=torch.float32))
        self.register_buffer("ha", (_sylvester(a) / math.sqrt(a)).float())
        self.register_buffer("hb", (_sylvester(b) / math.sqrt(b)).float())

    def hadamard(self, x: torch.Tensor) -> torch.Tensor:
        """``x H / sqrt(n)`` (no signs): ``H_a`` on the rows, ``H_b`` on the columns of each ``[a, b]`` block."""
        a, b = self.ha.shape[0], self.hb.shape[0]
        y = torch.matmul(self.ha, reshape_tail(x, self.m, a, b))
        return reshape_tail(torch.matmul(y, self.hb), self.n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hadamard(x * self.signs)

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        return self.hadamard(x) * self.signs

    def matrix(self) -> torch.Tensor:
        """The dense ``Q [n, n]`` in float64 (for the weight transforms and the tests)."""
        a, b = self.ha.shape[0], self.hb.shape[0]
        x = torch.diag(self.signs.double()).reshape(self.n, self.m, a, b)
        return (self.ha.double() @ x @ self.hb.double()).reshape(self.n, self.n)


class UnitNorm(nn.Module):
    """An RMSNorm whose gain was folded into the projections after it (weight all ones)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.eps = float(norm.eps)
        self.register_buffer("weight", torch.ones_like(norm.weight.detach(), dtype=torch.float32))


def _k_rows(rot: HadamardRotation, v: torch.Tensor) -> torch.Tensor:
    """``K v`` in float64 for ``v [n, c]``, ``K = I_m (x) H_a (x) H_b`` the rotation without its signs,
    as two small contractions per ``[a, b]`` block: ``2 n sqrt(p)`` multiply-adds per column instead of
    the dense matrix's ``n^2`` (the first-start build's time: docs/history/performance.md)."""
    a, b = rot.ha.shape[0], rot.hb.shape[0]
    x = torch.einsum("ij,mjbc->mibc", rot.ha.double(), v.reshape(rot.m, a, b, -1))
    return torch.einsum("kl,milc->mikc", rot.hb.double(), x).reshape(v.shape)


def reads(w: torch.Tensor, rot: HadamardRotation, gain: torch.Tensor | None = None) -> torch.Tensor:
    """A projection ``[in, out]`` reading a rotated, gain-folded input: ``Q^T diag(gain) W``
    (``= K diag(s) diag(gain) W``: ``Q = diag(s) K`` and ``K`` is symmetric)."""
    w64 = w.detach().double() * rot.signs.double()[:, None]
    if gain is not None:
        w64 = gain.detach().double()[:, None] * w64
    return _k_rows(rot, w64).float().contiguous()


def writes(w: torch.Tensor, rot: HadamardRotation) -> torch.Tensor:
    """A projection ``[in, out]`` writing into the rotated stream: ``W Q`` (``= (K (W diag(s))^T)^T``)."""
    w64 = w.detach().double() * rot.signs.double()[None, :]
    return _k_rows(rot, w64.T.contiguous()).T.float().contiguous()


def rotate_layer(layer: nn.Module, q: HadamardRotation, mid: HadamardRotation) -> None:
    """Rotate one :class:`~qtts.export.graphs.FusedLayer` in place: residual ``q``, MLP rotation ``mid``,
    whose signs go into the ``up`` columns: the graph applies only its Hadamard part."""
    signs = torch.cat([torch.ones_like(mid.signs), mid.signs])  # gate columns unchanged, up columns * s
    with torch.no_grad():
        layer.qkv = nn.Parameter(reads(layer.qkv, q, layer.input_layernorm.weight), requires_grad=False)
        layer.o = nn.Parameter(writes(layer.o, q), requires_grad=False)
        gate_up = reads(layer.gate_up, q, layer.post_attention_layernorm.weight) * signs
        layer.gate_up = nn.Parameter(gate_up.contiguous(), requires_grad=False)
        layer.down = nn.Parameter(writes(reads(layer.down, mid), q), requires_grad=False)
    layer.input_layernorm = UnitNorm(layer.input_layernorm)
    layer.post_attention_layernorm = UnitNorm(layer.post_attention_layernorm)
    layer.mid_rotation = mid


def rotate_stack(layers: nn.ModuleList, hidden: int) -> HadamardRotation:
    """Rotate every layer of a decoder stack; returns the residual rotation."""
    rot = HadamardRotation(hidden)
    mids: dict = {}  # one rotation per intermediate size, shared by the layers
    for layer in layers:
        if layer.intermediate not in mids:
            mids[layer.intermediate] = HadamardRotation(layer.intermediate)
        rotate_layer(layer, rot, mids[layer.intermediate])
    return rot
