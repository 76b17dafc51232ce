"""ONNX export of the forced aligner: one graph, fp32, then optionally int8/int4 weights.

Graph ``aligner``: inputs ``input_ids [1, tokens]`` int64 (the prompt of :func:`qtts.align.prompt_text`),
``chunks [chunks, n_mels, width]`` float32 and ``keep [audio_tokens]`` int64 (both from
:func:`qtts.model.aligner_audio.chunk_mel`, which cuts the log-mel on the host); output
``logits [1, tokens, classify_num]``. Every length is dynamic. The wrapper is
:meth:`qtts.model.aligner.ForcedAlignerModel.logits` itself (no second copy of the model).

:func:`quantize_aligner` rewrites every ``MatMul`` with a constant weight (the audio and text
transformers' projections, the audio projector, ``conv_out`` and the 5000-class head) into
onnxruntime's ``MatMulNBits`` with the blocks of :func:`qtts.export.quantize.quantize_weight`;
the convs, the token embedding table and attention stay fp32.
"""

from __future__ import annotations

import logging
import os
import sys

from ..align.aligner import graph_feeds as graph_inputs
from ..errors import InputError, require
from .quantize import (
    ACCURACY_LEVEL,
    DEFAULT_BLOCK_SIZE,
    _constant,
    _sort_opsets,
    quantize_weight,
    replace_nodes,
)

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "chunks", "keep")


def export_aligner(model, path: str, seconds: float = 2.5, words: int = 6) -> dict:
    """Export a :class:`qtts.model.aligner.ForcedAlignerModel` to ``path``; returns its manifest description."""
    torch = require("torch", "export", "ONNX export")
    from ..model.aligner_audio import audio_tokens
    from .write import export_graph

    class AlignerGraph(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, chunks, keep):
            return self.inner.logits(input_ids, chunks, keep)

    cfg = model.cfg
    frames = int(seconds * 100)
    n = audio_tokens(frames, cfg.audio)
    ids = [cfg.audio_start_token_id or 0] + [cfg.audio_token_id] * n + [cfg.audio_end_token_id or 0]
    ids += [1000, cfg.timestamp_token_id, cfg.timestamp_token_id] * words
    feeds = graph_inputs(torch.tensor([ids]), torch.randn(cfg.audio.num_mel_bins, frames), cfg)
    args = tuple(torch.from_numpy(feeds[k]) for k in INPUTS)
    dyn = {"input_ids": {1: "tokens"}, "chunks": {0: "chunks", 2: "width"}, "keep": {0: "audio_tokens"},
           "logits": {1: "tokens"}}  # fmt: skip
    export_graph(AlignerGraph(model.eval()), args, path, list(INPUTS), ["logits"], dyn)
    return {"inputs": {"input_ids": [1, "tokens"], "chunks": ["chunks", cfg.audio.num_mel_bins, "width"],
                       "keep": ["audio_tokens"]},
            "outputs": {"logits": [1, "tokens", cfg.classify_num]},
            "front_end": "qtts.audio.aligner_features.log_mel (16 kHz) + qtts.model.aligner_audio.chunk_mel",
            "timestamp_token_id": cfg.timestamp_token_id, "timestamp_segment_time": cfg.timestamp_segment_time}  # fmt: skip


def quantize_aligner(path: str, bits: int = 8, block_size: int = DEFAULT_BLOCK_SIZE,
                     accuracy_level: int = ACCURACY_LEVEL) -> dict:  # fmt: skip
    """Rewrite the aligner graph at ``path`` in place with ``bits``-bit block weights; returns the settings."""
    if bits not in (4, 8):
        raise InputError(f"{bits}-bit aligner weights are not supported; use 8 or 4")
    if block_size not in (16, 32, 64, 128, 256):
        raise InputError(f"block size {block_size} is not supported; use 32, 64 or 128")
    onnx = require("onnx", "export", "weight quantization")
    from onnx import numpy_helper

    from .write import save_model

    model = onnx.load(path)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    done, nodes = {}, []
    for node in graph.node:
        init = _constant(node.input[1], inits, producers) if node.op_type == "MatMul" else None
        if init is None or len(init.dims) != 2 or init.data_type != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        k, n = init.dims
        if init.name not in done:
            packed, scales = quantize_weight(numpy_helper.to_array(init), bits, block_size)
            done[init.name] = (numpy_helper.from_array(packed, f"{init.name}_Q{bits}"),
                               numpy_helper.from_array(scales, f"{init.name}_scales"))  # fmt: skip
        qb, qs = done[init.name]
        nodes.append(onnx.helper.make_node(
            "MatMulNBits", [node.input[0], qb.name, qs.name], list(node.output), name=node.name + "_Q",
            domain="com.microsoft", K=k, N=n, bits=bits, block_size=block_size, accuracy_level=accuracy_level))
    replace_nodes(model, nodes, done)
    _sort_opsets(model)
    save_model(model, path)
    count = sum(1 for node in graph.node if node.op_type == "MatMulNBits")
    log.info("%s: %d MatMul -> MatMulNBits (int%d, block %d)", path, count, bits, block_size)
    return {"precision": f"int{bits}", "bits": bits, "block_size": block_size, "symmetric": True,
            "accuracy_level": accuracy_level, "quantized_matmuls": count}  # fmt: skip


def build(snapshot: str, folder: str, precision: str) -> str:
    """``folder/aligner.onnx`` of an aligner snapshot, fp32 or int8 (what :mod:`qtts.align.runtime` caches)."""
    from ..model.aligner import load_aligner

    if precision not in ("fp32", "int8"):
        raise InputError(f"aligner precision '{precision}': use fp32 or int8")
    graph = os.path.join(folder, "aligner.onnx")
    export_aligner(load_aligner(snapshot, "float32"), graph)
    if precision == "int8":
        quantize_aligner(graph, bits=8)  # rewrites aligner.onnx(.data) in place
    return graph


if __name__ == "__main__":  # python -m qtts.export.aligner SNAPSHOT FOLDER PRECISION (the aligner cache's child)
    logging.basicConfig(level=logging.WARNING)
    build(*sys.argv[1:4])
