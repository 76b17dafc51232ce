"""Activation-aware weight scaling (AWQ-style) folded into the fp32 model before quantization.

A projection ``y = W x`` can be written ``y = (W diag(s)) (x / s)`` for any per-input-channel
scales ``s > 0``. Where ``x / s`` can be had for free, by dividing the weight of the RMSNorm that
produces ``x`` (or the rows of the projection that produces it) by ``s``, the fp32 model is
unchanged (up to rounding) and the quantizer sees ``W diag(s)``: input channels whose activations
are large get proportionally more of each block's levels, so their error, which the large
activations multiply, shrinks. That is what helps on real LLM weights, whose few outlier input
channels carry activations 10-100x the rest.

Folds (per decoder layer of the talker and the predictor):

* q/k/v <- ``input_layernorm``; gate/up <- ``post_attention_layernorm`` (norm weight / s);
* down <- rows of ``up_proj`` (``silu(gate) * up`` is linear in ``up``);
* o <- rows of ``v_proj`` (the attention output of a head is a weighted sum of its kv head's
  values; ``s`` is shared by the query heads of a kv group);
* the predictor's 15 heads <- the predictor's final norm (one ``s`` for all heads).

Not folded: the talker's codec head (its input, the final-normed hidden state, is also the
predictor's input) and the 1.7B predictor's input projection (no norm before it).

``s = mean|x|^alpha`` (normalised to geometric mean ~1), per group the ``alpha`` of :data:`ALPHAS`
(0 = no scaling) with the least output error ``||A(X/s) Q(W s)^T - X W^T||^2`` over the
calibration activations, with the absmax quantizer ``Q`` of the weight's precision and ``A`` the
kernel's int8 activations (``accuracy_level`` 4: outlier channels cost the other channels of
their block precision there too); fp32 consumers add no error, a group with none quantized is
left alone. The activations come from the torch fp32 model
generating greedily on :data:`CALIBRATION_TEXTS` (other sentences than `qtts verify plan`'s).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from .quantize import fake_quant
from .recipe import BITS, WeightId

log = logging.getLogger(__name__)

ALPHAS = tuple(i / 10 for i in range(11))
CALIBRATION_TEXTS = (
    "Calibration is a short walk through ordinary words before the measured sentence.",
    "Seven bright kites drifted over the harbour while the bakery opened its doors.",
    "Numbers like twenty-one and questions such as why not? belong here too.",
)
CALIBRATION_FRAMES = 16
MAX_ROWS = 256  # activation rows per group used by the scale search (the statistics use all)


def _groups(talker, recipe) -> list[dict]:
    """Every foldable group: its activation module (hooked), consumers (module, WeightId), fold target."""
    out = []
    pred = talker.code_predictor
    for comp, layers in (("talker", talker.model.layers), ("predictor", pred.model.layers)):
        for i, layer in enumerate(layers):
            att, mlp = layer.self_attn, layer.mlp
            # o and down first: their folds rescale v_proj / up_proj rows, which qkv / gate_up then quantize
            groups = (("o", att.o_proj, (att.o_proj,), ("heads", att)),
                      ("down", mlp.down_proj, (mlp.down_proj,), ("rows", mlp.up_proj)),
                      ("qkv", att.q_proj, (att.q_proj, att.k_proj, att.v_proj), ("norm", layer.input_layernorm)),
                      ("gate_up", mlp.gate_proj, (mlp.gate_proj, mlp.up_proj), ("norm", layer.post_attention_layernorm)))  # fmt: skip
            for kind, hook, consumers, fold in groups:
                ids = [WeightId(comp, kind, layer=i)] * len(consumers)
                out.append({"key": f"{comp}.{i}.{kind}", "hook": hook, "consumers": list(zip(consumers, ids)), "fold": fold})
    heads = [(h, WeightId("predictor", "head", codebook=j + 1)) for j, h in enumerate(pred.lm_head)]
    out.append({"key": "predictor.heads", "hook": tuple(pred.lm_head), "consumers": heads, "fold": ("norm", pred.model.norm)})
    return [g for g in out if any(recipe.precision(w) != "fp32" for _, w in g["consumers"])]


def capture(groups: list[dict], run) -> dict:
    """Run ``run()`` with forward pre-hooks on every group's activation module(s); key -> rows [n, K] fp32."""
    rows: dict = {g["key"]: [] for g in groups}
    handles = []
    for g in groups:
        mods = g["hook"] if isinstance(g["hook"], tuple) else (g["hook"],)
        for mod in mods:
            def hook(_mod, args, key=g["key"]):
                rows[key].append(args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu().numpy())
            handles.append(mod.register_forward_pre_hook(hook))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return {k: np.concatenate(v) for k, v in rows.items() if v}


def calibration_run(talker, snapshot: str, texts=CALIBRATION_TEXTS, frames: int = CALIBRATION_FRAMES):
    """A function generating greedily with the torch fp32 ``talker`` on ``texts`` (what :func:`capture` runs)."""
    from ..backends.torch import TorchBackend
    from ..config import ModelConfig
    from ..text.tokenizer import TextTokenizer
    from .verify import generate_codes, greedy_params, reference_prompt

    parts = SimpleNamespace(config=ModelConfig.from_dir(snapshot, speech_tokenizer=False),
                            tokenizer=TextTokenizer.from_dir(snapshot))  # fmt: skip
    backend = TorchBackend(talker)
    lp = greedy_params(parts.config, frames)

    def run():
        for text in texts:
            prompt, speaker = reference_prompt(parts, text)
            generate_codes(backend, prompt, lp, speaker)

    return run


def _scales_for(stat: np.ndarray, alpha: float, group: dict) -> np.ndarray:
    s = np.maximum(stat, 1e-8) ** alpha
    if group["fold"][0] == "heads":  # one scale per (kv head, dim), shared by the query heads of the group
        att = group["fold"][1]
        s = s.reshape(att.heads, att.head_dim)
        per_kv = s.reshape(att.kv_heads, att.heads // att.kv_heads, att.head_dim).mean(axis=1)
        s = np.repeat(per_kv, att.heads // att.kv_heads, axis=0).reshape(-1)
    return (s / np.sqrt(s.max() * s.min())).astype(np.float32)


def act_quant(x: np.ndarray, block: int) -> np.ndarray:
    """``x [n, K]`` through the kernel's int8 activations (``accuracy_level`` 4: absmax per block of K)."""
    n, k = x.shape
    kb = -(-k // block)
    blocks = np.pad(x, ((0, 0), (0, kb * block - k))).reshape(n, kb, block)
    scale = np.max(np.abs(blocks), axis=-1, keepdims=True) / 127.0
    q = np.rint(np.divide(blocks, scale, out=np.zeros_like(blocks), where=scale > 0)) * scale
    return q.reshape(n, -1)[:, :k]


def _error(x: np.ndarray, weights: list, s: np.ndarray, block: int) -> float:
    """Output error of the quantized consumers with scales ``s`` (``weights``: (W [out, in], bits)),
    activations ``x / s`` quantized as the kernel does."""
    err = 0.0
    xq = act_quant(x / s, block)
    for w, bits in weights:
        wq = fake_quant((w * s).T, bits, block).T
        err += float(np.sum((xq @ wq.T - x @ w.T) ** 2))
    return err


def search(x: np.ndarray, weights: list, group: dict, block: int, alphas=ALPHAS) -> tuple:
    """(scales, alpha, error at alpha 0, best error) for one group."""
    stat = np.mean(np.abs(x), axis=0)
    sample = x[np.linspace(0, len(x) - 1, min(len(x), MAX_ROWS)).astype(int)]
    ones = np.ones_like(stat)
    plain = _error(sample, weights, ones, block)
    best = (ones, 0.0, plain)
    for alpha in (a for a in alphas if a):
        s = _scales_for(stat, alpha, group)
        err = _error(sample, weights, s, block)
        if err < best[2]:
            best = (s, alpha, err)
    return best[0], best[1], plain, best[2]


def fold(group: dict, s: np.ndarray) -> None:
    """Apply ``s`` in place: consumers' input columns * s, the producer / 1 / s (fp32 unchanged)."""
    import torch

    st = torch.from_numpy(s)
    with torch.no_grad():
        for mod, _ in group["consumers"]:
            mod.weight.mul_(st.to(mod.weight.dtype))
        how, target = group["fold"]
        if how == "norm":
            target.weight.div_(st.to(target.weight.dtype))
        elif how == "rows":
            target.weight.div_(st.to(target.weight.dtype)[:, None])
        else:  # "heads": v_proj rows, one scale per (kv head, dim)
            kv = st.reshape(target.heads, target.head_dim)[:: target.heads // target.kv_heads].reshape(-1)
            target.v_proj.weight.div_(kv.to(target.v_proj.weight.dtype)[:, None])


def apply_awq(talker, snapshot: str, recipe, block: int, run=None) -> dict:
    """Fold activation-aware scales into ``talker`` (in place) for ``recipe``'s quantized weights;
    returns what was done (per group alpha and the calibration error ratio) for the manifest."""
    groups = _groups(talker, recipe)
    acts = capture(groups, run or calibration_run(talker, snapshot))
    chosen = {}
    for g in groups:
        if g["key"] not in acts:
            continue
        weights = [(m.weight.detach().float().numpy(), BITS[recipe.precision(w)]) for m, w in g["consumers"]
                   if recipe.precision(w) != "fp32"]  # fmt: skip
        s, alpha, plain, best = search(acts[g["key"]], weights, g, block)
        if alpha:
            fold(g, s)
        chosen[g["key"]] = {"alpha": alpha, "error_ratio": round(best / plain, 4) if plain else 1.0}
    rows = {k: len(v) for k, v in acts.items()}
    log.info("awq: %d groups scaled of %d", sum(1 for c in chosen.values() if c["alpha"]), len(chosen))
    return {"calibration_texts": len(CALIBRATION_TEXTS), "calibration_frames": CALIBRATION_FRAMES,
            "rows_min": min(rows.values(), default=0), "groups": chosen}  # fmt: skip
