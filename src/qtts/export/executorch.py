"""ExecuTorch (XNNPACK) exports: the fixed-shape steps as ``.pte`` files and a whole bundle + plan.

``torch.export`` -> ``to_edge_transform_and_lower(XnnpackPartitioner)`` -> ``.pte`` (runtime:
:mod:`qtts.backends.executorch`). Needs the ``executorch`` extra, in its own environment
(``scripts/setup_executorch_env.sh`` makes ``.venv-et``: executorch 1.5.1 + torchao next to torch
2.13 CPU); nothing in the core package imports this module.

* :func:`export_talker_pte`: :class:`~qtts.export.graphs.PlainTalkerStep` (one position, a
  fixed ``max_len``-slot KV cache in and out, the position as an input).
* :func:`export_predictor_pte`: :class:`~qtts.export.graphs.PlainPredictorStep` (17-slot KV,
  one-hot slot, 15 heads gathered by index); driven by :class:`qtts.backends.plain.PlainPredictor`.
* :func:`export_vocoder_pte`: :class:`~qtts.model.vocoder_step.VocoderStep` of ``B`` frames
  (flat cache in and out); its :class:`~qtts.backends.vocoder_step.StepContract` goes to a
  ``.json`` beside it.
* :func:`export_et_bundle`: all of them + the text projection + the embedding tables, a
  ``plan.json`` and a ``manifest.json`` with the checkpoint fingerprint (``qtts export executorch``).

Weights (:data:`WEIGHTS`): ``fp32``; ``int8`` = torchao ``Int8DynamicActivationIntxWeightConfig``
with int8 per-channel weights ("8da8w"); ``int4`` = the same with int4 weights in groups of
:data:`GROUP_SIZE` along K ("8da4w", ExecuTorch's LLM scheme). Both quantize the ``nn.Linear``
layers of the talker, the predictor and the text projection (activations int8 per token at run
time, XNNPACK's dynamically quantized GEMM); the predictor's 15 heads (a gathered buffer), the
embedding tables and the vocoder stay fp32.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from collections import Counter

from ..errors import InputError, require
from ..files import atomic_path, temp_dir_beside

log = logging.getLogger(__name__)

WEIGHTS = ("fp32", "int8", "int4")
GROUP_SIZE = 32  # int4 weight group along K (divides every Linear of the real and the tiny checkpoints)
DEFAULT_MAX_LEN = 1024  # talker KV slots: prompt + frames (12 Hz: ~80 s of audio)
DEFAULT_CODES_LENGTH = 4  # vocoder frames per step (the remainder is zero-padded, see vocoder_step)
_HINT = "the ExecuTorch export (run scripts/setup_executorch_env.sh, then use .venv-et/bin/qtts)"


def _lower(module, args, out: str) -> dict:
    """Export, lower to XNNPACK and write ``out`` (temp name, then rename); returns node counts."""
    torch = require("torch", "executorch", _HINT)
    exir = require("executorch.exir", "executorch", _HINT)
    xnn = require("executorch.backends.xnnpack.partition.xnnpack_partitioner", "executorch", _HINT)
    with torch.no_grad():
        ep = torch.export.export(module.eval(), args)
    edge = exir.to_edge_transform_and_lower(ep, partitioner=[xnn.XnnpackPartitioner()])
    nodes = Counter(
        "delegated" if "executorch_call_delegate" in str(n.target) else "portable"
        for n in edge.exported_program().graph.nodes
        if n.op == "call_function" and "getitem" not in str(n.target)
    )
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with atomic_path(out, ".pte.part") as tmp, open(tmp, "wb") as fh:
        fh.write(edge.to_executorch().buffer)
    return {"path": out, "bytes": os.path.getsize(out), "delegate_calls": nodes["delegated"],
            "portable_ops": nodes["portable"]}  # fmt: skip


def quantized(module, weights: str):
    """A copy of ``module`` with its ``nn.Linear`` weights in the ``weights`` scheme (fp32: as is)."""
    if weights not in WEIGHTS:
        raise InputError(f"unknown --weights '{weights}'; use one of {', '.join(WEIGHTS)}")
    if weights == "fp32":
        return module
    torch = require("torch", "executorch", _HINT)
    tq = require("torchao.quantization", "executorch", "int8/int4 weights (torchao, in .venv-et)")
    gran = require("torchao.quantization.granularity", "executorch", "int8/int4 weights (torchao)")
    if weights == "int8":
        config = tq.Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=gran.PerAxis(0))
    else:
        config = tq.Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=gran.PerGroup(GROUP_SIZE)
        )

    def fits(mod, _fqn):
        return isinstance(mod, torch.nn.Linear) and (weights == "int8" or mod.in_features % GROUP_SIZE == 0)

    out = copy.deepcopy(module)
    tq.quantize_(out, config, filter_fn=fits)
    return out


def export_talker_pte(talker, out: str, max_len: int = DEFAULT_MAX_LEN, weights: str = "fp32") -> dict:
    """The talker step (:class:`~qtts.export.graphs.PlainTalkerStep`) of a loaded talker -> ``out``."""
    torch = require("torch", "executorch", _HINT)
    from .graphs import PlainTalkerStep

    if int(max_len) < 2:
        raise InputError(f"--max-len must be >= 2, got {max_len}")
    cfg = talker.cfg
    step = quantized(PlainTalkerStep(talker, int(max_len)).eval(), weights)
    kv = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, int(max_len), cfg.head_dim)
    args = (torch.zeros(1, 1, cfg.hidden_size), torch.tensor([3], dtype=torch.int64), torch.zeros(kv))
    report = _lower(step, args, out)
    report.update(kv=list(kv), hidden=int(cfg.hidden_size), vocab=int(cfg.vocab_size), max_len=int(max_len))
    return report


def export_predictor_pte(talker, out: str, weights: str = "fp32") -> dict:
    """The plain code-predictor step of ``talker`` (a loaded fp32 talker module) -> ``out`` .pte."""
    torch = require("torch", "executorch", _HINT)
    from .qnn import example_inputs, plain_step

    predictor = talker.code_predictor.float().eval()
    step = quantized(plain_step(predictor), weights)
    arrays = example_inputs(predictor.cfg, int(talker.cfg.hidden_size))
    report = _lower(step, tuple(torch.from_numpy(a) for a in arrays), out)
    report.update(kv=list(arrays[-1].shape), vocab=int(predictor.cfg.vocab_size))
    return report


def export_text_projection_pte(talker, out: str, weights: str = "fp32") -> dict:
    """``text_projection`` of one row ``[1, text_hidden] -> [1, H]`` (the host gathers the rows)."""
    torch = require("torch", "executorch", _HINT)
    from .graphs import TextProjectionGraph

    graph = quantized(TextProjectionGraph(talker).eval(), weights)
    return _lower(graph, (torch.zeros(1, talker.cfg.text_hidden_size),), out)


def export_vocoder_pte(decoder, codes_length: int, out: str) -> dict:
    """The B-frame vocoder step of a loaded fp32 ``decoder`` -> ``out`` .pte, its contract -> ``.json``."""
    from ..model.vocoder_step import VocoderStep
    from ..plans.plan import write_json
    from .vocoder import example_args, step_contract

    if int(codes_length) < 1:
        raise InputError(f"--codes-length must be >= 1, got {codes_length}")
    step = VocoderStep(decoder.float().eval(), int(codes_length)).eval()
    report = _lower(step, example_args(step), out)
    report["contract"] = step_contract(step)
    write_json(os.path.splitext(report["path"])[0] + ".json", json.loads(report["contract"].to_json()))
    return report


def _publish(tmp: str, out: str) -> None:
    from .onnx import _swap  # the ONNX bundle's replace-as-a-whole (old one removed after)

    _swap(tmp, out)


def export_et_bundle(model_dir: str, out: str, weights: str = "fp32", max_len: int = DEFAULT_MAX_LEN,
                     codes_length: int = DEFAULT_CODES_LENGTH, overwrite: bool = False) -> dict:  # fmt: skip
    """Export the ExecuTorch bundle of a checkpoint into a fresh ``out``; returns the plan.

    An existing non-empty ``out`` is refused unless ``overwrite`` (``--force``); then it is
    replaced as a whole, never mixed with the new files.
    """
    from ..weights import resolve_snapshot

    if weights not in WEIGHTS:
        raise InputError(f"unknown --weights '{weights}'; use one of {', '.join(WEIGHTS)}")
    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"{out}: exists and is not a directory; choose another -o")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise InputError(f"{out}: the bundle directory exists and is not empty; pass --force to replace it")
    require("executorch.exir", "executorch", _HINT)  # before any work: the main install has no executorch
    snapshot = resolve_snapshot(model_dir)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = temp_dir_beside(out, ".bundle.part")
    try:
        plan = _build(snapshot, tmp, weights, int(max_len), int(codes_length))
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return plan


def _build(snapshot: str, out: str, weights: str, max_len: int, codes_length: int) -> dict:
    from ..plans.plan import MANIFEST, PLAN, PLAN_VERSION, source_info, write_json
    from ..version import __version__
    from ..weights import load_checkpoint
    from .write import write_tables

    ckpt = load_checkpoint(snapshot, components=("talker", "decoder"))
    talker = ckpt.model.talker.float().eval()
    files = write_tables(talker, out)
    files["text_projection"] = f"text_projection.{weights}.pte"
    graphs = {
        "talker": export_talker_pte(talker, os.path.join(out, f"talker.{weights}.pte"), max_len, weights),
        "predictor": export_predictor_pte(talker, os.path.join(out, f"predictor_step.{weights}.pte"), weights),
        "text_projection": export_text_projection_pte(talker, os.path.join(out, files["text_projection"]), weights),
        "vocoder": export_vocoder_pte(ckpt.speech_tokenizer.decoder, codes_length,
                                      os.path.join(out, f"vocoder.b{codes_length}.pte")),
    }  # fmt: skip
    graphs["vocoder"]["contract"] = json.loads(graphs["vocoder"]["contract"].to_json())
    precision = {"talker": weights, "predictor": weights, "vocoder": "fp32"}
    plan = {"version": PLAN_VERSION}
    for name in ("talker", "predictor", "vocoder"):
        graphs[name]["file"] = os.path.basename(graphs[name].pop("path"))
        plan[name] = {"impl": "executorch", "artifacts": {"main": graphs[name]["file"]}, "precision": precision[name]}
    graphs["text_projection"]["file"] = os.path.basename(graphs["text_projection"].pop("path"))
    manifest = {
        "qtts_version": __version__, "runtime": "executorch", "backend": "xnnpack", "graphs": graphs,
        "runtime_files": files, "source": source_info(snapshot), "precision": precision,
        "options": {"weights": weights, "group_size": GROUP_SIZE if weights == "int4" else None,
                    "max_len": max_len, "codes_length": codes_length},
    }  # fmt: skip
    write_json(os.path.join(out, MANIFEST), manifest)
    write_json(os.path.join(out, PLAN), plan)
    log.info("exported the ExecuTorch bundle (%s weights) to %s", weights, out)
    return plan
