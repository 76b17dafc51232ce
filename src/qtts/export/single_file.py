"""Export a torch module to ONE self-contained ONNX file with qtts metadata, atomically.

Used for fixed-shape step graphs that NPU toolchains load as a single file (the vocoder step,
the plain predictor step). Larger multi-graph bundles use :func:`qtts.export.onnx.export_graph`
(weights in a ``.data`` file beside the graph).
"""

from __future__ import annotations

import os
import warnings

from ..errors import require
from ..files import temp_beside

OPSET = 17


def export_single_file(module, args: tuple, out: str, inputs: list, outputs: list, metadata: dict) -> str:
    """``torch.onnx.export`` (TorchScript exporter, opset 17, fixed shapes) to a temp file in the
    target directory, add ``metadata`` (str -> str) as model metadata, then rename to ``out``."""
    torch = require("torch", "export", "ONNX export")
    onnx = require("onnx", "export", "ONNX export")
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = temp_beside(out, ".onnx.tmp")  # mode 0666 & ~umask, unlike mkstemp's 0600
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # int(shape) is static on purpose
            torch.onnx.export(
                module, args, tmp, input_names=list(inputs), output_names=list(outputs),
                opset_version=OPSET, do_constant_folding=True, dynamo=False,
            )  # fmt: skip
        model = onnx.load(tmp)
        for key, value in metadata.items():
            prop = model.metadata_props.add()
            prop.key, prop.value = key, value
        onnx.save(model, tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
