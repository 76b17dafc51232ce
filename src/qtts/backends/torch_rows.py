"""Batch-invariant linear layers for the torch backend's batch seam (``talker_rows``, ``predict_frames``).

A batched engine (``qtts serve --max-batch N --plan torch``) steps every active stream's row through
one matmul. torch's fp32 ``F.linear`` calls MKL, which picks its kernel by the row count ``M``: one
row takes a gemv path, 2..15 rows one sgemm blocking and 16 or more another at the talker's shapes
(AVX-512 Xeon; at the tiny test shapes, 64 -> 3072, 3 rows already differ from 2). Each kernel
rounds a row's dot products differently in the last bits, so a stream's logits depended on how many
streams were stepped with it, and a near-tie between two codes, or the seeded sampling after one,
then changed what the stream says.

Inside :class:`RowLinear` every ``F.linear`` (every ``nn.Linear``) runs on groups of exactly
:data:`GROUP` rows: the rows are cut into groups and the last group is filled up with copies of the
last row. Every call then has the same shape, so MKL runs the same kernel for every row, and a row's
result does not depend on its place in the group (checked at the real and the tiny shapes). A
stream's row is the same computation alone on a batched engine and in a batch of any size. The
one-stream engine (``qtts.load`` with ``max_batch=1``) never enters this mode.

Why 3: MKL's cost per call is flat from 1 to 3 rows and jumps at 4 (the 0.6B talker's linears, 2
threads, Intel Xeon VM: 1 row 61 ms, 3 rows 69, 4 rows 114). Per step of a random full-size 0.6B
checkpoint (talker step + predictor frame, ``benchmarks/perf/torch_rows.py``) groups of 3 cost +23 %
alone, +19 % for 2 streams, +17 % for 4; oneDNN's matmul (row-count invariant from 2 rows) cost
+59 % alone and +17 % for 4, so groups it is (docs/usage.md, "Batch invariance").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: rows of every linear call inside :class:`RowLinear`
GROUP = 3


class RowLinear(TorchFunctionMode):
    """A context in which ``F.linear`` computes each row independently of the number of rows (see
    the module docstring). Thread-local, like every torch function mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return linear_rows(*args, **kwargs)
        return func(*args, **kwargs)


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``x [..., K]`` flattened to rows and run :data:`GROUP` rows a call."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows % GROUP:
        flat = torch.cat([flat, flat[-1:].expand(GROUP - rows % GROUP, -1)])
    outs = [F.linear(flat[i : i + GROUP], weight, bias) for i in range(0, flat.shape[0], GROUP)]
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out[:rows].reshape(*x.shape[:-1], weight.shape[0])
