"""Planted real-weight structure for random checkpoints (``qtts random-checkpoint --planted``).

Plain random checkpoints have Gaussian weights and activations of one size in every channel; on
them 4-bit round-to-nearest is already near what any 4-bit scalar quantizer can reach. Trained
LLMs (Qwen-family included) differ in two ways that make plain block-wise 4-bit much worse, and
that the repairs (:mod:`qtts.export.awq`, fitted block scales) exist for. Both are planted here,
in the talker and the predictor, everything else staying as in :mod:`qtts.tools.random_weights`:

* **heavy-tailed weights**: every projection (q/k/v/o, gate/up/down) and head weight is Student-t
  with :data:`T_DF` = 4 degrees of freedom (excess kurtosis unbounded; a 128-block's largest entry
  is ~2x further out than a Gaussian's), rescaled to the same std;
* **outlier input channels** (outlier features / massive activations): in each stack the same
  few channels (:func:`outliers`: one per 256 of the width, at least one) of every
  ``input_layernorm`` and ``post_attention_layernorm`` weight, and of the predictor's final norm,
  are multiplied by gains log-uniform in [10, 100], so the normalized activations entering q/k/v,
  gate/up and the predictor heads are 10-100x larger there; likewise a few rows of every
  ``up_proj`` (one per 256 intermediate channels), so the inputs of ``down_proj`` carry outliers.

The talker's final norm is left alone (its output is also the predictor's input; see awq.py).
"""

from __future__ import annotations

import math
import zlib

import torch

T_DF = 4.0
GAIN_RANGE = (10.0, 100.0)
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def outliers(width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(channel indices, gains) planted in a ``width``-wide activation."""
    gen = torch.Generator().manual_seed(int(seed))
    n = max(1, width // 256)
    idx = torch.randperm(width, generator=gen)[:n]
    lo, hi = (math.log(g) for g in GAIN_RANGE)
    gains = torch.exp(lo + (hi - lo) * torch.rand(n, generator=gen))
    return idx, gains


def _student_t(name: str, seed: int):
    def fn(w):
        gen = torch.Generator().manual_seed(int(seed) * 7919 + zlib.crc32(name.encode()))
        chi2 = _chi2(w.shape, gen)
        return w * torch.rsqrt(chi2 / T_DF) * math.sqrt((T_DF - 2.0) / T_DF)

    return fn


def _chi2(shape, gen: torch.Generator) -> torch.Tensor:
    """Chi-square with T_DF (an even integer) degrees of freedom: a sum of squared normals."""
    z = torch.randn((int(T_DF), *shape), generator=gen)
    return (z * z).sum(0)


def _gain(idx, gains, rows: bool = False):
    def fn(w):
        w = w.clone()
        if rows:
            w[idx] *= gains[:, None]
        else:
            w[idx] *= gains
        return w

    return fn


def planted_edits(cfg, seed: int = 0) -> dict:
    """{tensor name: fn(value) -> value} planting the structure above into a ``ModelConfig``'s talker."""
    t = cfg.talker
    p = t.code_predictor_config
    edits = {"talker.codec_head.weight": _student_t("talker.codec_head.weight", seed)}
    stacks = (("talker.model.", t.num_hidden_layers, t.hidden_size, t.intermediate_size, 1),
              ("talker.code_predictor.model.", p.num_hidden_layers, p.hidden_size, p.intermediate_size, 2))  # fmt: skip
    for prefix, layers, hidden, inter, salt in stacks:
        idx, gains = outliers(hidden, seed * 31 + salt)
        up_idx, up_gains = outliers(inter, seed * 31 + salt + 10)
        for i in range(layers):
            pre = f"{prefix}layers.{i}."
            for proj in _PROJECTIONS:
                part = "self_attn" if proj[0] in "qkvo" else "mlp"
                name = f"{pre}{part}.{proj}.weight"
                edits[name] = _student_t(name, seed)
            edits[f"{pre}input_layernorm.weight"] = _gain(idx, gains)
            edits[f"{pre}post_attention_layernorm.weight"] = _gain(idx, gains)
            name = f"{pre}mlp.up_proj.weight"
            edits[name] = compose({name: edits[name]}, {name: _gain(up_idx, up_gains, rows=True)})[name]
    idx, gains = outliers(p.hidden_size, seed * 31 + 2)
    edits["talker.code_predictor.model.norm.weight"] = _gain(idx, gains)
    for j in range(p.num_code_groups - 1):
        name = f"talker.code_predictor.lm_head.{j}.weight"
        edits[name] = _student_t(name, seed)
    return edits


def compose(first: dict, then: dict | None) -> dict:
    """Edits ``first`` then ``then`` (the natural-EOS clock over planted weights)."""
    out = dict(first)
    for name, fn in (then or {}).items():
        out[name] = (lambda w, a=out[name], b=fn: b(a(w))) if name in out else fn
    return out
