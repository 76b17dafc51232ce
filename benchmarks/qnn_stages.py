"""Per-stage SNR of one QNN HTP fp16 vocoder step vs the same graph on the onnxruntime CPU EP.

    .venv/bin/python benchmarks/qnn_stages.py BUNDLE/vocoder_step4.onnx [--points 8] [--soc-model 57]

Exposes ~``--points`` Conv/ConvTranspose outputs as extra graph outputs (a copy of the graph in a
temp dir), runs one step from a zero cache with random codes on both EPs and prints the SNR and
the largest |activation| at each point: where fp16 precision is lost along the decoder. Exposing
an output can block a fusion (e.g. Conv+activation), so the final audio SNR here may differ
slightly from the unmodified graph's.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference

from qtts.audio.chunk import snr_db
from qtts.backends.onnx import OnnxVocoder
from qtts.backends.qnn import QnnOptions, qnn_session
from qtts.backends.vocoder_step import STEP_OUTPUTS, rope_freqs


def expose(src: str, dst: str, points: int) -> list[str]:
    model = onnx.load(src)
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    picked = convs[:: max(1, len(convs) // points)]
    if convs and convs[-1] not in picked:
        picked.append(convs[-1])
    infos = {v.name: v for v in shape_inference.infer_shapes(model).graph.value_info}
    names = []
    for node in picked:
        out = node.output[0]
        if out in infos and out not in {o.name for o in model.graph.output}:
            model.graph.output.append(infos[out])
            names.append(out)
    onnx.save(model, dst, save_as_external_data=model.ByteSize() > 1.5e9)
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("onnx", help="a vocoder step from `qtts export vocoder` / `qtts export qnn`")
    ap.add_argument("--points", type=int, default=8)
    ap.add_argument("--soc-model", default="57")
    args = ap.parse_args()
    contract = OnnxVocoder(args.onnx).contract
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stages.onnx")
        names = list(STEP_OUTPUTS) + expose(args.onnx, path, args.points)
        b = contract.codes_length
        feeds = {
            "audio_codes": np.random.default_rng(1).integers(0, 2048, (1, contract.num_quantizers, b)),
            "freqs_in": rope_freqs(0, b, np.asarray(contract.inv_freq, np.float32)),
            "cache_valid": np.zeros(1, np.float32),
            "cache_in": np.zeros(contract.cache_size, np.float32),
        }
        ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(names, feeds)
        test = qnn_session(path, QnnOptions(soc_model=args.soc_model)).run(names, feeds)
    for name, a, t in zip(names, ref, test):
        snr = snr_db(a.reshape(-1), t.reshape(-1))
        print(f"{name:45s} {str(a.shape):18s} SNR {snr:6.1f} dB   max|ref| {np.abs(a).max():.3g}")


if __name__ == "__main__":
    main()
