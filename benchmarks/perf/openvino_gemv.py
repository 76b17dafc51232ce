#!/usr/bin/env python3
"""OpenVINO int8/int4 weight compression against onnxruntime MatMulNBits: predictor frame and talker step.

    bash scripts/setup_openvino_env.sh                      # .venv-openvino (openvino, nncf, onnxruntime)
    PYTHONPATH=src .venv-openvino/bin/python benchmarks/perf/openvino_gemv.py \\
        --int8 BUNDLE8 --int4 BUNDLE4 --fp32 FP32_BUNDLE [--component predictor|talker] [--threads 1 2]

BUNDLE8 / BUNDLE4: bundles of ``qtts export onnx --weights int8|int4`` (MatMulNBits, block 128);
FP32_BUNDLE: ``qtts export onnx --components predictor --no-batch-graphs`` of the same checkpoint
(the fp32 reference, and the input of NNCF). Variants, all on the same inputs, interleaved:

* ``ort int8|int4``: the bundle graph in onnxruntime with the product's session options
  (``qtts.backends.onnx.session_options``; the talker with its KV bound in place, as the product);
  talker also ``(growing KV, as ov)``: past of ``--pos`` slots in, presents of ``--pos + 1`` out,
  the form OpenVINO's GroupQueryAttention returns (it never writes a fixed buffer in place);
* ``ov int8|int4 (same MatMulNBits graph)``: the *same* bundle graph read by OpenVINO (its ONNX
  frontend turns MatMulNBits into compressed-weight FullyConnected: identical quantized weights);
* ``ov nncf MODE``: the fp32 graph compressed by ``nncf.compress_weights`` (INT8_ASYM, INT8_SYM,
  INT4_SYM / INT4_ASYM group 128, ``all_layers=True``: every MatMul, heads included, as our plans);
* ``ort fp32``: the reference of the SNR figures.

OpenVINO runs on CPU with ``INFERENCE_NUM_THREADS``, the latency hint, one stream and f32
inference precision (``--bf16`` adds bf16 rows). Reports wall and process CPU (user + system) ms
per call, the foreign load, and the logits SNR against ``ort fp32`` (the predictor: all 15 passes
with greedy codes, which differ once one near-tie flips, so also pass 1 alone and how many leading
codes agree; the talker: same KV history, ``--inputs`` new tokens; without ``--fp32`` against ort
int8). Random weights: the SNR figures test the mechanism, not the real model.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402

from qtts.backends.onnx import session_options  # noqa: E402

NNCF_MODES = ("INT8_ASYM", "INT8_SYM", "INT4_SYM", "INT4_ASYM")


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    ref, x = np.asarray(ref, np.float64).ravel(), np.asarray(x, np.float64).ravel()
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - x) ** 2), 1e-30)))


def graph(bundle: str, component: str) -> str:
    pat = "predictor.frame.*.onnx" if component == "predictor" else "talker.*.onnx"
    hits = [p for p in sorted(glob.glob(os.path.join(bundle, pat))) if ".batch." not in p]
    if not hits:
        sys.exit(f"no {pat} in {bundle}; export it with 'qtts export onnx'")
    return hits[0]


# -- inputs -------------------------------------------------------------------------------------------
def predictor_feeds(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"hidden": rng.standard_normal((1, 1024)).astype(np.float32),
            "code0": np.array([int(rng.integers(0, 2048))], np.int64),
            "uniforms": rng.random(15).astype(np.float32), "temperature": np.array([0.9], np.float32),
            "top_k": np.array([50], np.int64), "top_p": np.array([1.0], np.float32),
            "do_sample": np.array([False])}


def talker_feeds(bundle: str, kv_len: int, pos: int, seed: int) -> dict:
    """One decode step at ``pos`` over a KV history of ``pos`` random slots (a growing cache: the
    presents are ``pos + 1`` long, what OpenVINO's GroupQueryAttention returns); rope tables of
    ``kv_len`` rows (the product's fixed buffer in :func:`ort_runner`)."""
    rng = np.random.default_rng(seed)
    cos = np.load(os.path.join(bundle, "tables", "rope_cos.npy"), mmap_mode="r")
    sin = np.load(os.path.join(bundle, "tables", "rope_sin.npy"), mmap_mode="r")
    feeds = {"embeds": (rng.standard_normal((1, 1, 1024)) * 0.1).astype(np.float32),
             "seqlens_k": np.array([pos], np.int32), "total_len": np.array(pos + 1, np.int32),
             "cos_cache": np.array(cos[:kv_len], np.float32), "sin_cache": np.array(sin[:kv_len], np.float32)}
    for i in range(28):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((1, 8, pos, 128)).astype(np.float32)
    return feeds


# -- runners: each returns (run: () -> None, logits: () -> np.ndarray) ---------------------------------
def ort_runner(path: str, threads: int, feeds: dict, component: str, in_place: bool = True):
    """``in_place`` (talker): the product's fixed KV buffer of ``len(cos_cache)`` slots bound as past
    *and* present (qtts.backends.onnx); otherwise a growing cache like OpenVINO's."""
    import onnxruntime as ort

    sess = ort.InferenceSession(path, session_options(threads), providers=["CPUExecutionProvider"])
    if component == "predictor":
        return (lambda: sess.run(["codes"], feeds)), (lambda: sess.run(["logits"], feeds)[0])
    if not in_place:
        return (lambda: sess.run(None, feeds)), (lambda: sess.run(["logits"], feeds)[0])
    io = sess.io_binding()
    io.bind_output("logits")  # fetched first, in this order; the presents stay in place
    io.bind_output("hidden")
    kv = {}
    for name, value in feeds.items():
        if name.startswith("past_"):  # past and present share one buffer, as qtts.backends.onnx
            buf = np.zeros(value.shape[:2] + (len(feeds["cos_cache"]),) + value.shape[3:], np.float32)
            buf[:, :, : value.shape[2]] = value
            kv[name] = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(name, kv[name])
            io.bind_ortvalue_output(name.replace("past_", "present_"), kv[name])
        else:
            io.bind_cpu_input(name, value)

    def run():  # the product binds the new token's embeds every step
        io.bind_cpu_input("embeds", feeds["embeds"])
        sess.run_with_iobinding(io)

    def logits():
        run()
        return io.get_outputs()[0].numpy().copy()  # the bound output is reused by the next run

    return run, logits


def ov_config(threads: int, precision: str) -> dict:
    return {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
            "INFERENCE_PRECISION_HINT": precision}


def ov_runner(model, threads: int, feeds: dict, precision: str = "f32"):
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", ov_config(threads, precision))
    req = compiled.create_infer_request()
    names = {i.get_any_name() for i in compiled.inputs}
    inputs = {k: v for k, v in feeds.items() if k in names}
    logits_port = compiled.output("logits")

    def logits():
        req.infer(inputs)
        return np.array(req.get_tensor(logits_port).data)

    return (lambda: req.infer(inputs)), logits


def _patch_nncf() -> None:
    """Two workarounds for NNCF 3.4's OpenVINO graph builder on these graphs (no effect on weights).

    OpenVINO keeps GroupQueryAttention as one internal op whose absent optional inputs are empty
    constants of type "dynamic" (mapped to f32 here: they carry no weights), and the ONNX frontend
    leaves a few consumers that are not part of the model (their edges are skipped).
    """
    import nncf
    import openvino as ov
    from nncf.openvino.graph.nncf_graph_builder import GraphConverter

    to_dtype = GraphConverter.convert_to_nncf_dtype
    GraphConverter.convert_to_nncf_dtype = staticmethod(lambda t: to_dtype(ov.Type.f32 if t.is_dynamic() else t))

    def add_edges(model, graph):
        live = {op.get_friendly_name() for op in model.get_ops()}
        for op in model.get_ops():
            src = graph.get_node_by_name(op.get_friendly_name()).node_id
            for port, out in enumerate(op.outputs()):
                for inp in out.get_target_inputs():
                    dst = inp.get_node().get_friendly_name()
                    if dst not in live:
                        continue
                    graph.add_edge_between_nncf_nodes(
                        from_node_id=src, to_node_id=graph.get_node_by_name(dst).node_id,
                        tensor_shape=list(out.partial_shape.get_max_shape()), input_port_id=inp.get_index(),
                        output_port_id=port, dtype=GraphConverter.convert_to_nncf_dtype(out.get_element_type()))

    GraphConverter._add_edges_to_nncf_graph = staticmethod(add_edges)
    del nncf


_NNCF = {}


def nncf_model(fp32_path: str, mode: str):
    """The fp32 graph compressed by NNCF (once per process and mode; not saved: OpenVINO IR cannot
    hold the internal GroupQueryAttention op)."""
    if (fp32_path, mode) not in _NNCF:
        import nncf
        import openvino as ov

        if not _NNCF:
            _patch_nncf()
        kw = {"group_size": 128, "ratio": 1.0, "all_layers": True} if mode.startswith("INT4") else {}
        model = ov.Core().read_model(fp32_path)
        _NNCF[(fp32_path, mode)] = nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, mode), **kw)
    return _NNCF[(fp32_path, mode)]


# -- main ---------------------------------------------------------------------------------------------
def build(args, threads: int, feeds: dict) -> dict:
    """name -> (run, logits) for one thread count."""
    import openvino as ov

    c = args.component
    out = {}
    for tag, bundle in (("int8", args.int8), ("int4", args.int4)):
        if bundle:
            out[f"ort {tag} (MatMulNBits)"] = ort_runner(graph(bundle, c), threads, feeds, c)
            if c == "talker":
                out[f"ort {tag} (growing KV, as ov)"] = ort_runner(graph(bundle, c), threads, feeds, c, False)
            if "mnb" in args.ov:
                model = ov.Core().read_model(graph(bundle, c))
                out[f"ov {tag} (same MatMulNBits graph)"] = ov_runner(model, threads, feeds)
                if args.bf16:
                    out[f"ov {tag} (same graph, bf16)"] = ov_runner(model, threads, feeds, "bf16")
    if args.fp32:
        out["ort fp32"] = ort_runner(graph(args.fp32, c), threads, feeds, c)
        for mode in args.nncf:
            out[f"ov nncf {mode.lower()}"] = ov_runner(nncf_model(graph(args.fp32, c), mode), threads, feeds)
    return out


def fidelity(ref: list, got: list) -> dict:
    """Logits SNR over the inputs; for the predictor also pass 1 alone (before codes can differ) and the
    number of leading passes whose greedy code agrees with the reference."""
    out = {"snr": snr_db(np.concatenate([r.ravel() for r in ref]), np.concatenate([g.ravel() for g in got]))}
    if ref[0].ndim == 2 and ref[0].shape[0] == 15:
        out["snr_pass1"] = snr_db(np.stack([r[0] for r in ref]), np.stack([g[0] for g in got]))
        same = [np.argmax(r, -1) == np.argmax(g, -1) for r, g in zip(ref, got)]
        out["agree"] = float(np.mean([np.cumprod(s).sum() for s in same]))
    return out


def logits_all(logits, feeds: dict, inputs: list) -> list:
    """``logits()`` for each input set, written in place into the arrays the runners captured."""
    keep = {k: feeds[k].copy() for k in inputs[0]}
    got = []
    for inp in inputs:
        for k, v in inp.items():
            np.copyto(feeds[k], v)
        got.append(logits())
    for k, v in keep.items():
        np.copyto(feeds[k], v)
    return got


def measure(args, threads: int, feeds: dict, inputs: list, ref: list) -> dict:
    runners = build(args, threads, feeds)
    fid = {name: fidelity(ref, logits_all(logits, feeds, inputs)) for name, (_, logits) in runners.items()}
    res = interleaved({n: r for n, (r, _) in runners.items()}, args.rounds, inner=args.inner)
    for name in res:
        res[name].update(fid[name])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--int8", help="int8 bundle (MatMulNBits)")
    ap.add_argument("--int4", help="int4 bundle (MatMulNBits)")
    ap.add_argument("--fp32", help="fp32 bundle of the same component (reference; NNCF input)")
    ap.add_argument("--component", choices=("predictor", "talker"), default="predictor")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--nncf", nargs="*", default=list(NNCF_MODES), choices=NNCF_MODES)
    ap.add_argument("--ov", nargs="*", default=["mnb"], choices=["mnb"], help="mnb: OpenVINO on the bundle graph")
    ap.add_argument("--bf16", action="store_true", help="also OpenVINO with bf16 inference precision")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--inputs", type=int, default=4, help="input sets for the SNR figures")
    ap.add_argument("--kv-len", type=int, default=128, help="talker: KV slots of the product's fixed buffer")
    ap.add_argument("--pos", type=int, default=100)
    ap.add_argument("--json", help="write the raw samples here")
    args = ap.parse_args()
    base = args.int8 or args.int4 or args.fp32
    if args.component == "predictor":
        feeds, inputs = predictor_feeds(0), [predictor_feeds(seed) for seed in range(args.inputs)]
    else:  # one KV history (the arrays are large); different new tokens
        feeds = talker_feeds(base, args.kv_len, args.pos, 0)
        inputs = [{"embeds": talker_feeds(base, 1, 0, seed)["embeds"]} for seed in range(args.inputs)]
    ref_graph = graph(args.fp32 or args.int8, args.component)  # no fp32 graph: agreement with ort int8
    ref = logits_all(ort_runner(ref_graph, 2, feeds, args.component)[1], feeds, inputs)
    allres = {}
    for t in args.threads:
        res = measure(args, t, feeds, inputs, ref)
        unit = "ms/frame (15 passes)" if args.component == "predictor" else "ms/step"
        print(f"{args.component}, {t} thread(s), loadavg {loadavg()} {os.getloadavg()}", flush=True)
        print(report(res, unit=unit), flush=True)
        for name, r in res.items():
            extra = f", pass 1 {r['snr_pass1']:.1f} dB, greedy codes agreeing {r['agree']:.1f}/15" if "agree" in r else ""
            print(f"    {name:<44} logits SNR vs {'ort fp32' if args.fp32 else 'ort int8'}: {r['snr']:.1f} dB{extra}")
        allres[str(t)] = res
    if args.json:
        with open(args.json + ".tmp", "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "loadavg": os.getloadavg(), "results": allres}, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
