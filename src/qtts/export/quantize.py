"""Block-wise weight-only quantization of exported graphs with onnxruntime's MatMulNBits.

Every ``MatMul`` whose right operand is a constant weight (the fused q/k/v, o, gate/up and down
projections, the codec head and the 15 predictor heads) becomes a ``com.microsoft::MatMulNBits``
with symmetric 8- or 4-bit blocks along K. Embedding ``Gather`` tables and attention stay fp32.

``accuracy_level`` 4 (int8 activations in the kernel) was chosen by measurement on this machine
kind: 2-3x faster than level 0 (fp32 activations) for batch-1 GEMVs of the real shapes, and the
fidelity matrix (docs/fidelity.md) is measured with it.
"""

from __future__ import annotations

import logging

from ..errors import InputError, require

log = logging.getLogger(__name__)

BITS = {"int8": 8, "int4": 4}
#: MatMulNBits accuracy level (4 = int8 compute), chosen by measurement (see module docstring)
ACCURACY_LEVEL = 4
#: MatMulNBits block size along K, chosen by measurement (docs/performance.md): on the full-size
#: 0.6B talker and predictor, block 128 is 10-20 % faster than 32 (int8 talker 21-23 vs 26-31 ms,
#: predictor 50-58 vs 64-77 ms per frame) for ~2 dB less talker-logit SNR (docs/fidelity.md)
DEFAULT_BLOCK_SIZE = 128


def quantize_file(
    path: str, precision: str, block_size: int = DEFAULT_BLOCK_SIZE, accuracy_level: int = ACCURACY_LEVEL
) -> dict:
    """Quantize the graph at ``path`` in place (fp32 -> ``precision``); returns the recorded settings."""
    if precision == "fp32":
        return {"precision": "fp32"}
    if precision not in BITS:
        raise InputError(f"unknown weight precision '{precision}'; use one of fp32, int8, int4")
    if block_size not in (16, 32, 64, 128, 256):
        raise InputError(f"block size {block_size} is not supported; use 32, 64 or 128")
    onnx = require("onnx", "export", "weight quantization")
    nbits = require("onnxruntime.quantization.matmul_nbits_quantizer", "export", "weight quantization")
    from .write import save_model

    model = onnx.load(path)
    quant = nbits.MatMulNBitsQuantizer(
        model,
        bits=BITS[precision],
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        op_types_to_quantize=("MatMul",),
    )
    quant.process()
    qmodel = quant.model.model
    count = sum(1 for n in qmodel.graph.node if n.op_type == "MatMulNBits")
    _sort_opsets(qmodel)
    save_model(qmodel, path)
    log.info("%s: %d MatMul -> MatMulNBits (%s, block %d)", path, count, precision, block_size)
    return {
        "precision": precision,
        "bits": BITS[precision],
        "block_size": block_size,
        "symmetric": True,
        "accuracy_level": accuracy_level,
        "quantized_matmuls": count,
    }


def _sort_opsets(model) -> None:
    """Make the opset import order deterministic (the quantizer appends the contrib domain)."""
    imports = sorted((o.domain, o.version) for o in model.opset_import)
    del model.opset_import[:]
    for domain, version in imports:
        entry = model.opset_import.add()
        entry.domain, entry.version = domain, version
