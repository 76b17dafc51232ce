"""Export the talker, code predictor and text projection to ONNX and write a bundle.

A bundle directory holds the graphs (``*.onnx`` + one ``*.onnx.data`` external-data file each),
numpy embedding tables (``tables/*.npy``, loaded with ``mmap_mode='r'``), the speech decoder
artifacts (from :mod:`qtts.export.vocoder`), ``plan.json`` (per component impl / artifacts /
precision) and ``manifest.json`` (source checkpoint hash, opset, graph inputs/outputs, precision
per component, qtts version). Export is deterministic: the same checkpoint and options give
byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, require
from ..files import publish
from .quantize import DEFAULT_BLOCK_SIZE

log = logging.getLogger(__name__)

OPSET = 17
PRECISIONS = ("fp32", "int8", "int4")
COMPONENTS = ("talker", "code_predictor", "speech_decoder", "speaker_encoder", "speech_encoder")
#: code-predictor graph flavours: one fused 15-step frame graph, or one graph per step
PREDICTOR_MODES = ("frame", "step")


@dataclass(frozen=True)
class ExportOptions:
    #: weight precision of the talker stack and heads (MatMulNBits for int8/int4)
    talker: str = "fp32"
    #: weight precision of the code predictor (its 15 steps per frame dominate the frame time)
    code_predictor: str = "fp32"
    #: MatMulNBits quantization block size along K (32 is the most faithful, 128 the fastest)
    block_size: int = DEFAULT_BLOCK_SIZE
    #: predictor graph flavour ("frame": fused 15 steps with in-graph sampling; "step": per step)
    predictor_mode: str = "frame"
    #: speech decoder steps (codes per call) for the "first" and "main" artifacts; 0 skips the vocoder
    vocoder_first: int = 2
    vocoder_main: int = 8
    #: export only these components (default: all)
    components: tuple = COMPONENTS
    #: reuse the speech decoder of another bundle (its plan entry, paths made relative to this bundle)
    speech_decoder_from: str | None = None


# ---------------------------------------------------------------------------- low level


def export_graph(module, args: tuple, path: str, inputs: list, outputs: list, dynamic_axes: dict) -> None:
    """``torch.onnx.export`` (TorchScript exporter, opset 17) then a deterministic save to ``path``."""
    torch = require("torch", "export", "ONNX export")
    onnx = require("onnx", "export", "ONNX export")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as tmp:
        raw = os.path.join(tmp, "raw.onnx")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings: python ints are static on purpose
            torch.onnx.export(
                module, args, raw, opset_version=OPSET, dynamo=False, do_constant_folding=True,
                input_names=inputs, output_names=outputs, dynamic_axes=dynamic_axes,
                custom_opsets={"com.microsoft": 1},
            )  # fmt: skip
        model = onnx.load(raw)
    save_model(model, path)


def save_model(model, path: str) -> None:
    """Save with all weights in ``<name>.data`` next to ``path`` (atomic rename, no timestamps)."""
    onnx = require("onnx", "export", "ONNX export")
    model.producer_name, model.producer_version = "qtts", ""
    for init in model.graph.initializer:  # drop stale external-data pointers from a previous save
        if init.data_location == onnx.TensorProto.EXTERNAL:
            raise InputError(f"{path}: load the model with its external data before saving it")
    directory, name = os.path.split(os.path.abspath(path))
    tmp = tempfile.mkdtemp(dir=directory)
    try:
        onnx.save_model(
            model, os.path.join(tmp, name), save_as_external_data=True, all_tensors_to_one_file=True,
            location=name + ".data", size_threshold=1024,
        )  # fmt: skip
        for fname in (name, name + ".data"):
            src = os.path.join(tmp, fname)
            if os.path.exists(src):
                publish(src, os.path.join(directory, fname))  # umask, not the writer's 0600
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _kv_dynamic(names: list) -> dict:
    return {n: {2: "kv_len"} for n in names}


# ---------------------------------------------------------------------------- per graph


def export_talker(talker, path: str) -> dict:
    """Talker prefill/step graph; returns its description for the manifest."""
    import torch

    from .graphs import TalkerGraph, kv_names, rope_tables

    cfg = talker.cfg
    n = cfg.num_hidden_layers
    wrapper = TalkerGraph(talker).eval()
    kv_len, t = 8, 3
    cos, sin = rope_tables(kv_len, cfg.head_dim, cfg.rope_theta)
    past = [torch.zeros(1, cfg.num_key_value_heads, kv_len, cfg.head_dim) for _ in range(2 * n)]
    args = (torch.zeros(1, t, cfg.hidden_size), torch.tensor([t - 1], dtype=torch.int32),
            torch.tensor(t, dtype=torch.int32), cos, sin, *past)  # fmt: skip
    inputs = ["embeds", "seqlens_k", "total_len", "cos_cache", "sin_cache", *kv_names(n, "past")]
    outputs = ["logits", "hidden", *kv_names(n, "present")]
    dyn = {"embeds": {1: "T"}, "cos_cache": {0: "kv_len"}, "sin_cache": {0: "kv_len"}}
    dyn.update(_kv_dynamic(kv_names(n, "past")))
    dyn.update(_kv_dynamic(kv_names(n, "present")))
    export_graph(wrapper, args, path, inputs, outputs, dyn)
    return {"inputs": inputs[:5] + [f"past_{{key,value}}_0..{n - 1}"], "outputs": outputs[:2],
            "kv": [1, cfg.num_key_value_heads, "kv_len", cfg.head_dim], "layers": n}  # fmt: skip


def export_predictor_step(talker, path: str, max_len: int = 17) -> dict:
    import torch

    from .graphs import PredictorStepGraph, kv_names, rope_tables

    cp = talker.code_predictor
    cfg = cp.cfg
    n = cfg.num_hidden_layers
    wrapper = PredictorStepGraph(cp).eval()
    cos, sin = rope_tables(max_len, cfg.head_dim, cfg.rope_theta)
    past = [torch.zeros(1, cfg.num_key_value_heads, max_len, cfg.head_dim) for _ in range(2 * n)]
    args = (torch.zeros(1, 2, talker.cfg.hidden_size), torch.tensor([1], dtype=torch.int32),
            torch.tensor(2, dtype=torch.int32), cos, sin, *past)  # fmt: skip
    inputs = ["embeds", "seqlens_k", "total_len", "cos_cache", "sin_cache", *kv_names(n, "past")]
    heads = [f"logits_{j}" for j in range(cfg.num_code_groups - 1)]
    outputs = [*heads, *kv_names(n, "present")]
    export_graph(wrapper, args, path, inputs, outputs, {"embeds": {1: "T"}})
    return {"inputs": inputs[:5] + [f"past_{{key,value}}_0..{n - 1}"], "outputs": heads,
            "kv": [1, cfg.num_key_value_heads, max_len, cfg.head_dim], "layers": n}  # fmt: skip


def export_predictor_frame(talker, path: str) -> dict:
    import torch

    from .graphs import PredictorFrameGraph

    wrapper = PredictorFrameGraph(talker).eval()
    args = (torch.zeros(1, talker.cfg.hidden_size), torch.zeros(1, dtype=torch.int64), torch.zeros(15),
            torch.ones(1), torch.ones(1, dtype=torch.int64), torch.ones(1), torch.zeros(1, dtype=torch.bool))  # fmt: skip
    inputs = ["hidden", "code0", "uniforms", "temperature", "top_k", "top_p", "do_sample"]
    export_graph(wrapper, args, path, inputs, ["codes"], {})
    return {"inputs": inputs, "outputs": ["codes"]}


def export_text_projection(talker, path: str) -> dict:
    import torch

    from .graphs import TextProjectionGraph

    wrapper = TextProjectionGraph(talker).eval()
    args = (torch.zeros(2, talker.cfg.text_hidden_size),)
    export_graph(wrapper, args, path, ["rows"], ["embeds"], {"rows": {0: "n"}, "embeds": {0: "n"}})
    return {"inputs": ["rows"], "outputs": ["embeds"]}


def export_speech_encoder_for(snapshot: str, out: str):
    """The speech-tokenizer encoder (reference audio -> codes, ICL cloning), Base checkpoints only.

    Returns ``(plan entry, manifest entry)``, or ``(None, None)`` when the checkpoint cannot clone.
    """
    from ..config import ModelConfig
    from ..weights import load_checkpoint
    from .encoders import export_speech_encoder

    if ModelConfig.from_dir(snapshot, speech_tokenizer=False).tts_model_type != "base":
        return None, None
    ckpt = load_checkpoint(snapshot, components=("encoder",))
    info = export_speech_encoder(ckpt.speech_tokenizer.encoder, os.path.join(out, "speech_encoder.onnx"))
    entry = {"impl": "onnx", "artifacts": {"main": "speech_encoder.onnx"}, "precision": "fp32"}
    return entry, info


def write_tables(talker, directory: str) -> dict:
    """Embedding tables as ``.npy`` (fp32): text rows, talker codec rows, 15 predictor tables."""
    os.makedirs(directory, exist_ok=True)
    tables = {
        "text_embedding": talker.model.text_embedding.weight,
        "codec_embedding": talker.model.codec_embedding.weight,
        "predictor_codec_embedding": None,
    }
    out = {}
    for name, weight in tables.items():
        if weight is None:
            arr = np.stack(
                [e.weight.detach().float().numpy() for e in talker.code_predictor.model.codec_embedding]
            )
        else:
            arr = weight.detach().float().numpy()
        path = os.path.join(directory, name + ".npy")
        _save_npy(path, np.ascontiguousarray(arr, dtype=np.float32))
        out[name] = {"file": os.path.relpath(path, os.path.dirname(directory)), "shape": list(arr.shape)}
    return out


def _save_npy(path: str, arr: np.ndarray) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, arr)
    os.replace(tmp, path)


def checkpoint_hash(model_dir: str) -> dict:
    """sha256 of every ``*.safetensors`` file of a snapshot (relative path -> hex digest)."""
    digests = {}
    for root, _dirs, files in sorted(os.walk(model_dir)):
        for fname in sorted(files):
            if fname.endswith(".safetensors"):
                path = os.path.join(root, fname)
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        h.update(block)
                digests[os.path.relpath(path, model_dir)] = h.hexdigest()
    return digests


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- bundle

MANIFEST = "manifest.json"
PLAN = "plan.json"


def read_manifest(bundle: str) -> dict:
    path = os.path.join(bundle, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read bundle manifest '{path}' ({exc}); re-run 'qtts export onnx'") from exc


def _graph_meta(cfg, **extra) -> dict:
    return {
        "layers": cfg.num_hidden_layers,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        **extra,
    }


def export_generation(talker, out: str, opts: ExportOptions) -> tuple[dict, dict, dict]:
    """Talker, code predictor, text projection and tables -> (plan entries, graph meta, runtime files)."""
    from .graphs import rope_tables
    from .quantize import quantize_file

    cfg, pcfg = talker.cfg, talker.code_predictor.cfg
    if (pcfg.head_dim, pcfg.rope_theta) != (cfg.head_dim, cfg.rope_theta):
        raise InputError("talker and code predictor RoPE differ; this exporter shares one table")
    plan, meta = {}, {}
    files = {k: v["file"] for k, v in write_tables(talker, os.path.join(out, "tables")).items()}
    cos, sin = rope_tables(min(cfg.max_position_embeddings, 32768), cfg.head_dim, cfg.rope_theta)
    for name, arr in (("rope_cos", cos), ("rope_sin", sin)):
        _save_npy(os.path.join(out, "tables", name + ".npy"), arr.numpy().astype(np.float32))
        files[name] = f"tables/{name}.npy"
    export_text_projection(talker, os.path.join(out, "text_projection.onnx"))
    files["text_projection"] = "text_projection.onnx"
    if "talker" in opts.components:
        name = f"talker.{opts.talker}.onnx"
        io = export_talker(talker, os.path.join(out, name))
        q = quantize_file(os.path.join(out, name), opts.talker, opts.block_size)
        plan["talker"] = {"impl": "onnx", "artifacts": {"main": name}, "precision": opts.talker}
        meta["talker"] = _graph_meta(cfg, io=io, quantization=q)
    if "code_predictor" in opts.components:
        mode = opts.predictor_mode
        if mode not in PREDICTOR_MODES:
            raise InputError(f"unknown predictor mode '{mode}'; use one of {', '.join(PREDICTOR_MODES)}")
        name = f"code_predictor.{mode}.{opts.code_predictor}.onnx"
        fn = export_predictor_frame if mode == "frame" else export_predictor_step
        io = fn(talker, os.path.join(out, name))
        q = quantize_file(os.path.join(out, name), opts.code_predictor, opts.block_size)
        plan["code_predictor"] = {
            "impl": "onnx",
            "artifacts": {"main": name},
            "precision": opts.code_predictor,
        }
        meta["code_predictor"] = _graph_meta(pcfg, io=io, quantization=q, mode=mode, max_len=17)
    return plan, meta, files


def export_bundle(model_dir: str, out: str, opts: ExportOptions) -> dict:
    """Export everything ``opts`` asks for into ``out``; returns the plan (also written to plan.json)."""
    from .. import __version__
    from ..weights import load_checkpoint, resolve_snapshot

    snapshot = resolve_snapshot(model_dir)
    os.makedirs(out, exist_ok=True)
    plan, meta, files = {}, {}, {}
    if {"talker", "code_predictor"} & set(opts.components):
        ckpt = load_checkpoint(snapshot, components=("talker",))
        plan, meta, files = export_generation(ckpt.model.talker, out, opts)
        del ckpt
    if "speaker_encoder" in opts.components:
        ckpt = load_checkpoint(snapshot, components=("speaker_encoder",))
        if ckpt.model.speaker_encoder is not None:
            from .encoders import export_speaker_encoder

            meta["speaker_encoder"] = export_speaker_encoder(
                ckpt.model.speaker_encoder, os.path.join(out, "speaker_encoder.onnx")
            )
            plan["speaker_encoder"] = {
                "impl": "onnx",
                "artifacts": {"main": "speaker_encoder.onnx"},
                "precision": "fp32",
            }
        del ckpt
    if "speech_encoder" in opts.components:
        plan_entry, meta_entry = export_speech_encoder_for(snapshot, out)
        if plan_entry is not None:
            plan["speech_encoder"], meta["speech_encoder"] = plan_entry, meta_entry
    if "speech_decoder" in opts.components and opts.vocoder_main > 0:
        entry, vmeta = export_speech_decoder(snapshot, out, opts)
        plan["speech_decoder"] = entry
        meta["speech_decoder"] = vmeta
    if opts.speech_decoder_from and "speech_decoder" not in plan:
        plan["speech_decoder"] = borrowed_speech_decoder(opts.speech_decoder_from, out)
    manifest = {
        "qtts_version": __version__,
        "opset": OPSET,
        "source": {"checkpoint_sha256": checkpoint_hash(snapshot)},
        "precision": {k: v.get("precision", "fp32") for k, v in plan.items()},
        "graphs": meta,
        "runtime_files": files,
        "options": {"block_size": opts.block_size, "predictor_mode": opts.predictor_mode},
    }
    write_json(os.path.join(out, MANIFEST), manifest)
    write_json(os.path.join(out, PLAN), plan)
    return plan


def borrowed_speech_decoder(bundle: str, out: str) -> dict:
    """The ``speech_decoder`` entry of another bundle's plan with artifact paths relative to ``out``."""
    from ..plan import load_plan

    spec = load_plan(os.path.join(bundle, PLAN)).get("speech_decoder")
    if spec.impl == "torch" or not spec.artifacts:
        raise InputError(f"{bundle}/{PLAN} has no exported speech decoder to reuse")
    arts = {k: os.path.relpath(v, os.path.abspath(out)) for k, v in spec.artifacts.items()}
    return {"impl": spec.impl, "artifacts": arts, "precision": spec.precision or "fp32"}


def export_speech_decoder(snapshot: str, out: str, opts: ExportOptions) -> tuple[dict, dict]:
    """The streaming vocoder step for the first and main chunk sizes (VOCODER helper's exporter)."""
    from . import vocoder as vexport

    artifacts, meta = {}, {}
    for key, b in (("first", opts.vocoder_first), ("main", opts.vocoder_main)):
        if b <= 0 or (key == "first" and b == opts.vocoder_main):
            continue
        name = f"speech_decoder.b{b}.onnx"
        info = vexport.export_vocoder_onnx(snapshot, codes_length=b, out=os.path.join(out, name))
        artifacts[key] = name
        info = info if isinstance(info, dict) else {}
        meta[key] = {k: info[k] for k in ("codes_length", "cache_size", "head_dim", "nodes") if k in info}
    return {"impl": "onnx", "artifacts": artifacts, "precision": "fp32"}, meta
