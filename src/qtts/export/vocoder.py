"""Export the stateful vocoder step (:class:`~qtts.model.vocoder_step.VocoderStep`) to ONNX and check it.

* fixed shapes, opset 17, the TorchScript exporter (``dynamo=False``): the RKNN converter loads
  this flavour; the step contract (B, N, head_dim, RoPE inverse frequencies, ...) is stored in the
  file's metadata (``qtts.step_contract``) and read back from it by every consumer;
* :func:`graph_report`: op counts, the ops the RKNN converter is known to choke on
  (:data:`RISKY_OPS`), and whether any attention key/value operand comes out of a Concat (the
  KV history must join through selection matmuls: the RKNN Concat path corrupts it);
* :func:`verify_onnx`: onnxruntime stepwise decode vs the torch offline decode (SNR in dB).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter

import numpy as np

from ..backends.vocoder_step import STEP_INPUTS, STEP_OUTPUTS, StepContract, rope_freqs
from ..errors import InputError, QttsError, require
from ..files import publish, temp_beside
from ..plans.plan import write_json
from .write import export_single_file

log = logging.getLogger(__name__)

OPSET = 17
RISKY_OPS = ("Pad", "Exp", "ConstantOfShape", "Shape", "Split", "Pow")
_PASS_THROUGH = {"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Cast", "Expand", "Tile"}


def load_decoder(model):
    """A fp32 :class:`~qtts.model.vocoder.Decoder` from a snapshot dir / hub id, or pass one through."""
    if hasattr(model, "quantizer"):
        return model.float().eval()
    from ..weights import load_checkpoint

    ckpt = load_checkpoint(str(model), components=("decoder",))
    return ckpt.speech_tokenizer.decoder.float().eval()


def step_contract(step, streams: int = 1) -> StepContract:
    cfg = step.decoder.config
    return StepContract(
        codes_length=step.codes_length, cache_size=step.cache_size, head_dim=cfg.head_dim,
        kv_slots=step.layout.kv_slots, samples_per_frame=step.samples_per_frame,
        inv_freq=tuple(float(x) for x in step.inv_freq()), num_quantizers=cfg.num_quantizers, streams=int(streams),
    )  # fmt: skip


def example_args(step) -> tuple:
    """Tracing inputs of a step: zero codes, the angles of positions 0.., a mid-range history count."""
    torch = require("torch", "export", "exporting the vocoder")
    b = step.codes_length
    return (
        torch.zeros(1, step.decoder.config.num_quantizers, b, dtype=torch.int64),
        torch.from_numpy(rope_freqs(0, b, step.inv_freq())),
        torch.full((1,), float(min(b, step.layout.kv_slots))),  # mid-range: no clamp branch folds away
        step.init_cache(),
    )


def export_vocoder_onnx(model, codes_length: int, out: str, streams: int = 1) -> dict:
    """Export a B=codes_length step to ``out`` (written to a temp name, then renamed); returns the report.

    ``streams`` > 1: a stacked step (:class:`~qtts.model.vocoder_step.StackedVocoderStep`) that runs
    that many streams' steps in one call (a batched server's ``run_batch``; bitwise equal to the
    one-stream step on onnxruntime CPU)."""
    require("torch", "export", "exporting the vocoder")
    from ..model.vocoder_step import StackedVocoderStep, VocoderStep

    if int(codes_length) < 1:
        raise InputError(f"--codes-length must be >= 1, got {codes_length}")
    if int(streams) < 1:
        raise InputError(f"streams must be >= 1, got {streams}")
    kind = StackedVocoderStep if int(streams) > 1 else VocoderStep
    step = kind(load_decoder(model), int(codes_length)).eval()
    contract = step_contract(step, streams)
    args = example_args(step)
    if int(streams) > 1:
        args = tuple(a[None].repeat(int(streams), *([1] * a.dim())) for a in args)
    out = export_single_file(
        step, args, out, STEP_INPUTS, STEP_OUTPUTS, {"qtts.step_contract": contract.to_json()}
    )
    report = graph_report(out)
    report.update(path=out, codes_length=step.codes_length, cache_size=contract.cache_size,
                  head_dim=contract.head_dim)  # fmt: skip
    log.info("exported %s: %d nodes, risky ops %s", out, report["nodes"], report["risky_ops"] or "none")
    return report


#: the weight file the bundle's vocoder steps share, and its index (read by backends/onnx.py)
SHARED_DATA, SHARED_INDEX = "vocoder.data", "vocoder.shared.json"
_ALIGN = 4096  # page-aligned tensors: every one can be memory-mapped on its own


def _weight_tensors(model):
    """Initializers and Constant-node tensors (the codebooks are folded into Constants) of >= 1 KB."""
    onnx = require("onnx", "export", "ONNX export")
    for init in model.graph.initializer:
        yield init, True
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t, False


def share_step_weights(directory: str, names: list[str], data_name: str = SHARED_DATA,
                       index_name: str | None = SHARED_INDEX) -> dict:
    """Move the weights of the step graphs ``names`` (files in ``directory``) into ONE file.

    Identical tensors (same type, shape and bytes) of different step sizes get one copy in
    ``data_name`` (:data:`SHARED_DATA`); each graph points at it as ONNX external data.
    ``index_name`` (:data:`SHARED_INDEX`; None: not written) maps every graph's initializer names
    to (dtype, shape, offset), so a runtime can map each tensor once and hand the same buffer to
    every step session (docs/history/performance.md, RSS). A graph's own former ``<name>.data`` file is
    removed. Returns the index. Deterministic: the same graphs give the same bytes.
    """
    onnx = require("onnx", "export", "ONNX export")
    from onnx import external_data_helper

    tensors: dict[str, dict] = {}
    graphs: dict[str, dict] = {}
    tmp = temp_beside(os.path.join(directory, data_name), ".tmp")
    with open(tmp, "wb") as data:
        for name in names:
            path = os.path.join(directory, name)
            model = onnx.load(path)
            graphs[name] = {}
            for t, is_init in _weight_tensors(model):
                if t.data_location == onnx.TensorProto.EXTERNAL or len(t.raw_data) < 1024:
                    continue
                key = hashlib.sha256(t.raw_data + repr((t.data_type, tuple(t.dims))).encode()).hexdigest()[:24]
                if key not in tensors:
                    data.write(b"\0" * (-data.tell() % _ALIGN))
                    tensors[key] = {"dtype": onnx.helper.tensor_dtype_to_np_dtype(t.data_type).str,
                                    "shape": list(t.dims), "offset": data.tell(), "length": len(t.raw_data)}  # fmt: skip
                    data.write(t.raw_data)
                info = tensors[key]
                external_data_helper.set_external_data(t, data_name, info["offset"], info["length"])
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
                if is_init:
                    graphs[name][t.name] = key
            onnx.save(model, path)
    publish(tmp, os.path.join(directory, data_name))
    for name in names:  # their weights now live in data_name
        if os.path.exists(os.path.join(directory, name + ".data")) and name + ".data" != data_name:
            os.unlink(os.path.join(directory, name + ".data"))
    index = {"data": data_name, "tensors": tensors, "graphs": graphs}
    if index_name is not None:
        write_json(os.path.join(directory, index_name), index)  # temp file + rename
    return index


def _producers(graph) -> dict:
    return {o: n for n in graph.node for o in n.output}


def _source(name: str, producers: dict):
    """The first producer of ``name`` that is not a pure shape/layout op."""
    node = producers.get(name)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    return node


def kv_concat_nodes(graph) -> list[str]:
    """Names of Concat nodes that directly produce an attention key or value operand."""
    producers = _producers(graph)
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    bad = []
    for sm in (n for n in graph.node if n.op_type == "Softmax"):
        node = producers.get(sm.input[0])
        while node is not None and node.op_type in ("Add", "Mul", "Cast", "Div"):
            node = producers.get(node.input[0])
        operands = [node.input[1]] if node is not None and node.op_type == "MatMul" else []
        out = sm.output[0]
        for _ in range(3):  # Softmax -> (Cast) -> MatMul(probs, V)
            nxt = consumers.get(out, [])
            mm = [n for n in nxt if n.op_type == "MatMul"]
            if mm:
                operands.append(mm[0].input[1])
                break
            if not nxt:
                break
            out = nxt[0].output[0]
        for op in operands:
            src = _source(op, producers)
            if src is not None and src.op_type == "Concat":
                bad.append(src.name or op)
    return bad


def graph_report(path: str) -> dict:
    """Op statistics and RKNN preflight for an exported step."""
    onnx = require("onnx", "export", "inspecting an ONNX file")
    graph = onnx.load(path, load_external_data=False).graph
    ops = Counter(n.op_type for n in graph.node)
    return {
        "nodes": sum(ops.values()),
        "ops": dict(sorted(ops.items())),
        "risky_ops": sorted(set(ops) & set(RISKY_OPS)),
        "kv_concat": kv_concat_nodes(graph),
        "softmax": ops.get("Softmax", 0),
    }


def verify_onnx(model, main: str, first: str | None = None, frames: int = 300, seed: int = 0,
                chunks: list[int] | None = None) -> float:  # fmt: skip
    """SNR (dB) of onnxruntime stepwise decoding vs the torch offline decode of random codes."""
    torch = require("torch", "torch", "the reference decode")
    from ..audio.chunk import snr_db
    from ..backends.onnx import OnnxVocoder

    decoder = load_decoder(model)
    dec = OnnxVocoder(main, first).stream()
    nq = dec.contract.num_quantizers
    codes = np.random.default_rng(seed).integers(0, decoder.config.codebook_size, (frames, nq))
    with torch.inference_mode():
        ref = decoder(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()
    chunks = chunks or [frames]
    outs, i = [], 0
    while i < frames:
        n = min(chunks[min(len(outs), len(chunks) - 1)], frames - i)
        outs.append(dec.decode(codes[i : i + n]))
        i += n
    got = np.concatenate(outs)
    if len(got) != len(ref):
        raise QttsError(f"ONNX step produced {len(got)} samples, expected {len(ref)}")
    return snr_db(ref, got)


def report_text(report: dict) -> str:
    risky = ", ".join(report["risky_ops"]) or "none"
    kv = "no Concat" if not report["kv_concat"] else f"Concat nodes {report['kv_concat']}"
    return (
        f"{report['path']}: B={report['codes_length']} N={report['cache_size']} head_dim={report['head_dim']}; "
        f"{report['nodes']} nodes; risky ops for rknn-toolkit2: {risky}; KV history join: {kv}\n"
        f"ops: {json.dumps(report['ops'])}"
    )
