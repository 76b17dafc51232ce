"""A knife-edge checkpoint: a random CustomVoice checkpoint whose codebook-0 choice is decided by rounding.

Random weights have no near-ties, so a stream whose logits move in the last bits with its batch
mates still picks the same codes and its audio does not show it (the HTTP invariance test then
passes on a batch-variant engine). This checkpoint makes every talker step a tie that only the
order of a dot product's additions breaks:

* two residual features ``J1`` and ``J2`` of the talker are equal in every position (every tensor
  that writes the residual stream writes the same value into both; the norms scale both alike);
* the codec head's rows ``A`` and ``B`` are ``u = e_J1 + r`` and ``v = e_J2 + r`` (``r`` random, zero
  at ``J1`` and ``J2``), so their logits are the same sum of the same products in another order,
  and rows ``C``, ``D`` are ``-u``, ``-v`` (so a tied pair is the maximum whatever the sign); every
  other row is scaled down 1000x.

So the greedy code 0 of every frame is one of the tied pair, picked by how the kernel rounded:
computed by another kernel (MKL picks one by the row count), the stream takes another path.
"""

from __future__ import annotations

import re
import shutil

import numpy as np

J1, J2 = 3, 29  # two residual features, far apart in a dot product's order
A, B, C, D = 100, 101, 102, 103  # ordinary codebook-0 codes (below the control ids)

#: tensors that write the talker's residual stream: output rows ([hidden, in]) or columns ([n, hidden])
_ROWS = re.compile(r"talker\.(model\.layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj)|text_projection\.linear_fc2)"
                   r"\.(weight|bias)$")  # fmt: skip
_COLUMNS = re.compile(r"talker\.(model\.codec_embedding|code_predictor\.model\.codec_embedding\.\d+)\.weight$")
_NORMS = re.compile(r"talker\.model\.(layers\.\d+\.(input_layernorm|post_attention_layernorm)|norm)\.weight$")


def _tie_features(name: str, w: np.ndarray) -> np.ndarray:
    """Make residual features J1 and J2 equal wherever ``name`` writes or scales them."""
    if _ROWS.search(name) or _NORMS.search(name):
        w[J2] = w[J1]
    elif _COLUMNS.search(name):
        w[:, J2] = w[:, J1]
    return w


def _tie_head(w: np.ndarray, seed: int) -> np.ndarray:
    """Codec head rows A, B = e_J1 + r, e_J2 + r and C, D = their negatives; the rest 1000x smaller."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(w.shape[1]).astype(w.dtype)
    r[[J1, J2]] = 0.0
    u, v = r.copy(), r.copy()
    u[J1], v[J2] = 1.0, 1.0
    w *= 1e-3
    w[A], w[B], w[C], w[D] = u, v, -u, -v
    return w


def knife_edge_checkpoint(src: str, out: str, seed: int = 0) -> str:
    """Copy the snapshot ``src`` (a tiny 0.6B-layout CustomVoice checkpoint) to ``out``, tied."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, out)
    path = f"{out}/model.safetensors"
    tensors = load_file(path)
    hidden = tensors["talker.model.norm.weight"].shape[0]
    assert J2 < hidden, f"the knife-edge features need a hidden size > {J2}, got {hidden}"
    for name, w in tensors.items():
        tensors[name] = _tie_features(name, w.copy())
    tensors["talker.codec_head.weight"] = _tie_head(tensors["talker.codec_head.weight"].copy(), seed)
    save_file(tensors, path, metadata={"format": "pt"})
    return out
