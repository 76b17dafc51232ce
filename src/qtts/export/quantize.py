"""Block-wise weight-only quantization of exported graphs with onnxruntime's MatMulNBits.

Every ``MatMul`` whose right operand is a constant weight (the fused q/k/v, o, gate/up and down
projections, the codec head, the 15 predictor heads and the 1.7B predictor's input projection)
becomes a ``com.microsoft::MatMulNBits`` with symmetric 8- or 4-bit blocks along K, at the
precision a :class:`~qtts.export.recipe.Recipe` gives that weight (fp32 weights stay MatMul).
Embedding ``Gather`` tables and attention stay fp32. A weight shared by several MatMuls (the
predictor frame graph runs its layers 15 times) is quantized once.

The blocks are packed here (numpy, :func:`quantize_weight`), bit for bit what onnxruntime's own
quantizer writes for absmax scales (``scale = the block's signed extreme / -2^(bits-1)``;
tests/export/test_quantize.py checks it), so the scales can also be fitted: ``mse`` searches the
clip ratio per block that minimises the block's squared weight error (:data:`CLIP_GRID`).

``accuracy_level`` 4 (int8 activations in the kernel) was chosen by measurement on this machine
kind: 2-3x faster than level 0 (fp32 activations) for batch-1 GEMVs of the real shapes, and the
fidelity matrix (docs/fidelity.md) is measured with it.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import InputError, require
from .recipe import BITS, Recipe, weight_id

log = logging.getLogger(__name__)

#: MatMulNBits accuracy level (4 = int8 compute), chosen by measurement (see module docstring)
ACCURACY_LEVEL = 4
#: MatMulNBits block size along K, chosen by measurement (docs/history/performance.md): on the full-size
#: 0.6B talker and predictor, block 128 is 10-20 % faster than 32 (int8 talker 21-23 vs 26-31 ms,
#: predictor 50-58 vs 64-77 ms per frame) for ~2 dB less talker-logit SNR (docs/fidelity.md)
DEFAULT_BLOCK_SIZE = 128
#: clip ratios the ``mse`` repair tries per block (1.0 = absmax)
CLIP_GRID = tuple(round(1.0 - 0.025 * i, 3) for i in range(21))  # 1.0 .. 0.5
_COLUMNS = 512  # output columns quantized per slice (bounds the working memory)


def _blocks(w: np.ndarray, block: int) -> np.ndarray:
    """``w [K, N]`` -> ``[N, k_blocks, block]`` (zero-padded along K)."""
    k, n = w.shape
    kb = -(-k // block)
    return np.pad(w, ((0, kb * block - k), (0, 0))).T.reshape(n, kb, block)


def _scales(blocks: np.ndarray, bits: int, ratio=1.0) -> np.ndarray:
    idx = np.argmax(np.abs(blocks), axis=-1)
    extreme = np.take_along_axis(blocks, idx[..., None], -1)[..., 0]
    return (extreme * ratio / -(1 << (bits - 1))).astype(np.float32)


def _codes(blocks: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """Signed codes in [-2^(b-1), 2^(b-1) - 1]."""
    half = 1 << (bits - 1)
    inv = np.divide(1.0, scales, out=np.zeros_like(scales), where=scales != 0)
    return np.clip(np.rint(blocks * inv[..., None]), -half, half - 1)


def _fit_scales(blocks: np.ndarray, bits: int) -> np.ndarray:
    """Per block, the clip ratio of :data:`CLIP_GRID` with the least squared weight error."""
    best = _scales(blocks, bits)
    best_err = np.full(best.shape, np.inf, dtype=np.float32)
    for ratio in CLIP_GRID:
        s = _scales(blocks, bits, ratio)
        err = np.sum((_codes(blocks, s, bits) * s[..., None] - blocks) ** 2, axis=-1)
        better = err < best_err
        best, best_err = np.where(better, s, best), np.where(better, err, best_err)
    return best


def quantize_weight(w: np.ndarray, bits: int, block: int, mse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``w [K, N]`` fp32 -> (MatMulNBits ``B [N, k_blocks, block*bits/8]`` uint8, ``scales [N, k_blocks]``)."""
    w = np.asarray(w, dtype=np.float32)
    k, n = w.shape
    packed, scales = [], []
    for c in range(0, n, _COLUMNS):
        blocks = _blocks(w[:, c : c + _COLUMNS], block)
        s = _fit_scales(blocks, bits) if mse else _scales(blocks, bits)
        q = (_codes(blocks, s, bits) + (1 << (bits - 1))).astype(np.uint8)
        q[:, :, :] *= (np.arange(q.shape[1] * block) < k).reshape(q.shape[1], block)  # padding: 0, like onnxruntime
        packed.append(q if bits == 8 else q[..., 0::2] | (q[..., 1::2] << 4))
        scales.append(s)
    return np.concatenate(packed), np.concatenate(scales)


def dequantize(packed: np.ndarray, scales: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The fp32 ``[K, N]`` weight MatMulNBits computes with (inverse of :func:`quantize_weight`)."""
    q = packed if bits == 8 else np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1)
    w = (q.astype(np.float32) - (1 << (bits - 1))) * scales[..., None]
    return w.reshape(w.shape[0], -1)[:, :k].T


def fake_quant(w: np.ndarray, bits: int, block: int, mse: bool = False) -> np.ndarray:
    """``w [K, N]`` after a quantize / dequantize round trip."""
    packed, scales = quantize_weight(w, bits, block, mse)
    return dequantize(packed, scales, bits, w.shape[0])


# ---------------------------------------------------------------------------- graphs


def _constant(name: str, inits: dict, producers: dict):
    """The initializer behind ``name`` (through Identity nodes), or None."""
    while name not in inits and name in producers and producers[name].op_type == "Identity":
        name = producers[name].input[0]
    return inits.get(name)


def _nbits_node(onnx, node, packed_name: str, scales_name: str, k: int, n: int, bits: int, block: int, level: int):
    return onnx.helper.make_node("MatMulNBits", [node.input[0], packed_name, scales_name], list(node.output),
                                 name=node.name + "_Q", domain="com.microsoft", K=k, N=n, bits=bits,
                                 block_size=block, accuracy_level=level)  # fmt: skip


def quantize_graph(model, component: str, recipe: Recipe, block: int, level: int = ACCURACY_LEVEL) -> dict:
    """Rewrite ``model`` (an onnx ModelProto with its weights loaded) in place; returns the settings."""
    onnx = require("onnx", "export", "weight quantization")
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    mse = "mse" in recipe.repair
    done, nodes, counts = {}, [], {}
    for node in graph.node:
        init = _constant(node.input[1], inits, producers) if node.op_type == "MatMul" else None
        if init is None or len(init.dims) != 2 or init.data_type != onnx.TensorProto.FLOAT or _rotation(init.name):
            nodes.append(node)
            continue
        precision = recipe.precision(weight_id(component, init.name))
        if precision == "fp32":
            nodes.append(node)
            continue
        bits, (k, n) = BITS[precision], init.dims
        if init.name not in done:
            packed, scales = quantize_weight(numpy_helper.to_array(init), bits, block, mse)
            done[init.name] = (numpy_helper.from_array(packed, f"{init.name}_Q{bits}"),
                               numpy_helper.from_array(scales, f"{init.name}_scales"))  # fmt: skip
        qb, qs = done[init.name]
        nodes.append(_nbits_node(onnx, node, qb.name, qs.name, k, n, bits, block, level))
        counts[precision] = counts.get(precision, 0) + 1
    replace_nodes(model, nodes, done)
    return {"quantized_matmuls": sum(counts.values()), "matmuls_by_precision": counts}


def replace_nodes(model, nodes: list, done: dict) -> None:
    """``model``'s graph becomes ``nodes`` (less the dead ones) with the initializers they read plus
    ``done``'s (packed weight, scales) pairs; the contrib opset is imported when anything was quantized."""
    onnx = require("onnx", "export", "weight quantization")
    graph = model.graph
    del graph.node[:]
    graph.node.extend(_live(nodes, graph))
    used = {i for n in graph.node for i in n.input}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep + [t for pair in done.values() for t in pair])
    if done and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def _rotation(name: str) -> bool:
    """A Hadamard factor of ``--repair rotate`` (:mod:`qtts.export.rotate`): a constant, not a weight."""
    return "rotation." in name


def _live(nodes: list, graph) -> list:
    """``nodes`` without the ones whose outputs nobody reads (the Identity nodes of quantized weights)."""
    outputs = {o.name for o in graph.output}
    while True:
        read = outputs | {i for n in nodes for i in n.input}
        kept = [n for n in nodes if any(o in read for o in n.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def quantize_file(path: str, component: str, recipe: Recipe, block_size: int = DEFAULT_BLOCK_SIZE,
                  accuracy_level: int = ACCURACY_LEVEL) -> dict:  # fmt: skip
    """Quantize the ``component`` graph at ``path`` in place as ``recipe`` says; returns the recorded settings."""
    if block_size not in (16, 32, 64, 128, 256):
        raise InputError(f"block size {block_size} is not supported; use 32, 64 or 128")
    if recipe.base(component) == "fp32" and recipe.uniform(component):
        return {"precision": "fp32"}
    onnx = require("onnx", "export", "weight quantization")
    from .write import save_model

    model = onnx.load(path)
    info = quantize_graph(model, component, recipe, block_size, accuracy_level)
    _sort_opsets(model)
    save_model(model, path)
    log.info("%s: %d MatMul -> MatMulNBits (%s, block %d)", path, info["quantized_matmuls"], recipe.text(), block_size)
    base = recipe.base(component)
    out = {"precision": base, "bits": BITS[base], "block_size": block_size, "symmetric": True,
           "accuracy_level": accuracy_level, **info}  # fmt: skip
    if not recipe.uniform(component):
        out["mix"] = [r.text for r in recipe.rules if r.selector.component == component]
    if recipe.repair:
        out["repair"] = list(recipe.repair)
    return out


def _sort_opsets(model) -> None:
    """Make the opset import order deterministic (the quantizer appends the contrib domain)."""
    imports = sorted((o.domain, o.version) for o in model.opset_import)
    del model.opset_import[:]
    for domain, version in imports:
        entry = model.opset_import.add()
        entry.domain, entry.version = domain, version


def streamed_weights(path: str) -> dict:
    """Weights a run of the graph at ``path`` streams: per MatMul / MatMulNBits node with a constant
    weight (a weight read by 15 nodes counts 15 times), elements and bytes (packed codes + scales)."""
    onnx = require("onnx", "export", "weight statistics")
    model = onnx.load(path, load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    size = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.FLOAT16: 2}
    weights, nbytes, by_bits = 0, 0, {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "MatMulNBits"):
            continue
        init = _constant(node.input[1], inits, producers)
        if init is None or _rotation(init.name):
            continue
        tensors = [init] + ([inits[node.input[2]]] if node.op_type == "MatMulNBits" else [])
        b = sum(int(np.prod(t.dims)) * size.get(t.data_type, 4) for t in tensors)
        attrs = {a.name: a.i for a in node.attribute}
        n = attrs["K"] * attrs["N"] if node.op_type == "MatMulNBits" else int(np.prod(init.dims))
        bits = attrs.get("bits", 32)
        weights, nbytes = weights + n, nbytes + b
        by_bits[bits] = by_bits.get(bits, 0) + n
    return {"weights": weights, "bytes": nbytes, "bits_per_weight": 8 * nbytes / weights if weights else None,
            "weights_by_bits": {str(k): v for k, v in sorted(by_bits.items())}}  # fmt: skip
