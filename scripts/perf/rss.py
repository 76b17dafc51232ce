#!/usr/bin/env python3
"""Where the resident memory of a plan goes (process RSS after loading and after a short run).

    PYTHONPATH=src .venv/bin/python scripts/perf/rss.py --plan /work/ckpt/full06-int4/plan.json \
        [--frames 16] [--share-vocoder] [--arena off]

Prints RSS (anonymous vs file-backed, from /proc/self/smaps) after each stage: import,
backend (talker + predictor + text projection + tables), decoder (vocoder sessions), a
``--frames`` run, and the biggest mappings. ``--share-vocoder``: the "first" and "main" vocoder
sessions get their weights from one set of OrtValues (SessionOptions.add_initializer) instead of
each session owning a copy. ``--arena off``: disable ORT's CPU memory arena for all sessions.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402


def smaps() -> tuple[float, float, list]:
    """(anon MB, file MB, [(MB, path)]) of the resident set."""
    anon = filed = 0.0
    per = collections.Counter()
    cur = None
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                continue
            if not parts[0].endswith(":") or "-" in parts[0]:
                cur = parts[5] if len(parts) > 5 else "[anon]"
                continue
            if parts[0] == "Rss:":
                mb = int(parts[1]) / 1024
                per[cur] += mb
                if cur.startswith("/") and not cur.startswith("/dev"):
                    filed += mb
                else:
                    anon += mb
    return anon, filed, per.most_common(8)


def show(stage: str) -> None:
    anon, filed, top = smaps()
    print(f"{stage:<34} RSS {anon + filed:7.0f} MB (anon {anon:7.0f}, file-backed {filed:6.0f})")
    return top


def shared_vocoder(paths: dict, threads: int):
    """OnnxStepDecoder whose sessions share one copy of the weights (add_initializer)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from qtts.backends.onnx import session_options
    from qtts.decoders import OnnxStepDecoder

    main = paths["main"]
    m = onnx.load(main, load_external_data=False)
    values = {}
    base = os.path.dirname(os.path.abspath(main))
    for init in m.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in init.external_data}
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        arr = np.memmap(os.path.join(base, info["location"]), dtype=dtype, mode="r",
                        offset=int(info["offset"]), shape=tuple(init.dims))
        values[init.name] = ort.OrtValue.ortvalue_from_numpy(arr)  # no copy: wraps the mapping
    del m, numpy_helper
    keep = []

    def factory(path):
        so = session_options(threads)
        so.add_session_config_entry("session.disable_prepacking", "1")  # prepacking would copy per session
        g = onnx.load(path, load_external_data=False)
        names = {i.name for i in g.graph.initializer}
        for name, v in values.items():
            if name in names:
                so.add_initializer(name, v)
        keep.append(so)
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    dec = OnnxStepDecoder(main, paths.get("first"), session_factory=factory)
    dec._shared_values = values
    return dec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/ckpt/full06")
    ap.add_argument("--plan", default="/work/ckpt/full06-int4/plan.json")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--share-vocoder", action="store_true")
    ap.add_argument("--arena", default="on")
    ap.add_argument("--ort-config", action="append", default=[], help="KEY=VALUE session config entry (all sessions)")
    args = ap.parse_args()
    if args.ort_config:
        import qtts.backends.onnx as ob

        orig_cfg = ob.session_options

        def with_cfg(threads=None, spinning=False):
            so = orig_cfg(threads, spinning)
            for kv in args.ort_config:
                so.add_session_config_entry(*kv.split("=", 1))
            return so

        ob.session_options = with_cfg
    if args.arena == "off":
        import qtts.backends.onnx as ob

        orig = ob.session_options

        def no_arena(threads=None, spinning=False):
            so = orig(threads, spinning)
            so.enable_cpu_mem_arena = False
            return so

        ob.session_options = no_arena
    from qtts.bench import BenchOptions, _loop_params, peak_rss_mb
    from qtts.generate import generate
    from qtts.plan import load_plan
    from qtts.runtime import Runtime
    from qtts.verify import _prompt

    show("python + imports")
    rt = Runtime.open(args.model, plan=args.plan, threads=2)
    show("backend (talker, predictor, tables)")
    if args.share_vocoder:
        spec = load_plan(args.plan).get("speech_decoder")
        dec = shared_vocoder({k: os.fspath(getattr(v, "path", v)) for k, v in spec.artifacts.items()}, 2)
    else:
        dec = rt.new_decoder()
    show("+ vocoder sessions")
    prompt, speaker = _prompt(rt, BenchOptions().text)
    lp = _loop_params(rt, args.frames, 0)
    pending = []
    wav = []
    for codes in generate(rt.backend, prompt, lp, speaker):
        pending.append(codes)
        if len(pending) >= 8 or len(wav) == 0 and len(pending) >= 2:
            wav.append(dec.decode(np.asarray(pending)))
            pending = []
    top = show(f"+ {args.frames}-frame run")
    print(f"peak RSS (ru_maxrss) {peak_rss_mb():.0f} MB")
    for path, mb in top:
        print(f"    {mb:7.0f} MB  {path}")
    np.save("/tmp/rss_wav.npy", np.concatenate(wav))


if __name__ == "__main__":
    main()
