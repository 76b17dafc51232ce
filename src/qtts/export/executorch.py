"""ExecuTorch (XNNPACK) exports of the fixed-shape steps (their runtime: :mod:`qtts.backends.executorch`).

``torch.export`` -> ``to_edge_transform_and_lower(XnnpackPartitioner)`` -> ``.pte`` ->
``executorch.runtime``. Needs the ``.venv-et`` environment (``scripts/setup_executorch_env.sh``:
executorch 1.5.1 next to torch 2.13 CPU); nothing in the core package imports this module.

* :func:`export_predictor_pte`: :class:`~qtts.export.graphs.PlainPredictorStep` (17-slot KV,
  one-hot slot, 15 heads gathered by index); driven by :class:`qtts.backends.qnn.PlainPredictor`.
* :func:`export_vocoder_pte`: :class:`~qtts.model.vocoder_step.VocoderStep` of ``B`` frames;
  driven by :class:`qtts.backends.executorch.EtVocoder` (the step schedule of :mod:`qtts.backends.vocoder_step`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter

from ..errors import require
from ..files import atomic_path

log = logging.getLogger(__name__)


def _lower(module, args, out: str) -> dict:
    """Export, lower to XNNPACK and write ``out`` (temp name, then rename); returns node counts."""
    torch = require("torch", "export", "the ExecuTorch export")
    exir = require(
        "executorch.exir", "executorch", "the ExecuTorch export (run scripts/setup_executorch_env.sh)"
    )
    xnn = require(
        "executorch.backends.xnnpack.partition.xnnpack_partitioner", "executorch", "the XNNPACK partitioner"
    )
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


def export_predictor_pte(talker, out: str) -> dict:
    """The plain code-predictor step of ``talker`` (a loaded fp32 talker module) -> ``out`` .pte."""
    torch = require("torch", "export", "the ExecuTorch export")
    from .qnn import example_inputs, plain_step

    predictor = talker.code_predictor.float().eval()
    step = plain_step(predictor)
    args = tuple(torch.from_numpy(a) for a in example_inputs(predictor.cfg, int(talker.cfg.hidden_size)))
    return _lower(step, args, out)


def export_vocoder_pte(decoder, codes_length: int, out: str) -> dict:
    """The B-frame vocoder step of a loaded fp32 ``decoder`` -> ``out`` .pte."""
    from ..model.vocoder_step import VocoderStep
    from .vocoder import example_args, step_contract

    step = VocoderStep(decoder.float().eval(), int(codes_length)).eval()
    report = _lower(step, example_args(step), out)
    report["contract"] = step_contract(step)
    return report
