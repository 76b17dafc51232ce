#!/usr/bin/env python3
"""Write the vocoder step graphs of several B so that they share ONE external weight file.

    PYTHONPATH=src .venv/bin/python scripts/perf/shared_weights.py OUT_DIR voc_b8.onnx voc_b2.onnx [...]

The first graph's initializers (>= 1 KB) go to OUT_DIR/speech_decoder.data; every other graph
points its identical initializers (same name, same bytes) at the same offsets. onnxruntime
memory-maps external initializers on the CPU EP, so all sessions then share one copy of the
weights (file-backed, shared page cache) instead of each holding ~456 MB of heap.
"""

from __future__ import annotations

import os
import sys

import hashlib

import onnx
from onnx import external_data_helper as edh


def _tensors(model):
    """Every weight tensor: initializers and Constant-node attributes (codebooks are folded there)."""
    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t


def _key(t) -> tuple:
    return (t.data_type, tuple(t.dims), hashlib.sha1(t.raw_data).hexdigest())


def main() -> None:
    out, first, *rest = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    data = "speech_decoder.data"
    m = onnx.load(first)
    keys = [_key(t) if len(t.raw_data) >= 1024 else None for t in _tensors(m)]
    onnx.save_model(m, os.path.join(out, os.path.basename(first)), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=data, size_threshold=1024, convert_attribute=True)
    ref = onnx.load(os.path.join(out, os.path.basename(first)), load_external_data=False)
    where = {}
    for key, t in zip(keys, _tensors(ref)):
        if key and t.data_location == onnx.TensorProto.EXTERNAL:
            where[key] = {e.key: e.value for e in t.external_data}
    for path in rest:
        g = onnx.load(path)
        shared = 0
        for t in _tensors(g):
            info = where.get(_key(t)) if len(t.raw_data) >= 1024 else None
            if info:
                edh.set_external_data(t, location=data, offset=int(info["offset"]), length=int(info["length"]))
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
                shared += 1
        onnx.save_model(g, os.path.join(out, os.path.basename(path)))
        print(f"{path}: {shared} initializers shared")


if __name__ == "__main__":
    main()
