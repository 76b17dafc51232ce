"""Export a checkpoint to an onnxruntime bundle: talker, predictor, text projection, vocoder, encoders.

A bundle directory holds the graphs (``*.onnx`` + one ``*.onnx.data`` external-data file each),
numpy embedding tables (``tables/*.npy``, loaded with ``mmap_mode='r'``), the vocoder step
artifacts (from :mod:`qtts.export.vocoder`), ``plan.json`` (per component impl / artifacts /
precision) and ``manifest.json`` (the source checkpoint's fingerprint and sha256, opset, graph
inputs/outputs, precision per component, qtts version; see :mod:`qtts.plans.plan`). Export is
deterministic: the same checkpoint and options give byte-identical files. The bundle is built in
a temporary directory beside the target and swapped in at the end, so a failed export leaves the
target as it was, and a re-export never mixes files of two exports.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

from ..config import PREDICTOR_STEPS
from ..errors import InputError
from ..files import temp_dir_beside
from ..plans.plan import COMPONENTS, MANIFEST, PLAN, load_plan, source_info, write_json
from .quantize import DEFAULT_BLOCK_SIZE
from .write import OPSET, checkpoint_hash, export_graph, write_tables

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "int8", "int4")
#: predictor graph flavours: one fused 15-step frame graph, or one graph per step
PREDICTOR_MODES = ("frame", "step")
PREDICTOR_SLOTS = PREDICTOR_STEPS + 2  # a frame's predictor positions: hidden, code 0, codebooks 1..15


@dataclass(frozen=True)
class ExportOptions:
    #: weight precision of the talker stack and heads (MatMulNBits for int8/int4)
    talker: str = "fp32"
    #: weight precision of the predictor (its 15 steps per frame dominate the frame time)
    predictor: str = "fp32"
    #: MatMulNBits quantization block size along K (32 is the most faithful, 128 the fastest)
    block_size: int = DEFAULT_BLOCK_SIZE
    #: predictor graph flavour ("frame": fused 15 steps with in-graph sampling; "step": per step)
    predictor_mode: str = "frame"
    #: vocoder steps (codes per call) for the "first" and "main" artifacts; 0 skips the vocoder.
    #: first = 1: the 1-frame first chunk of SynthesisOptions (lowest time to first audio)
    vocoder_first: int = 1
    vocoder_main: int = 8
    #: also stacked main vocoder steps for these stream counts (a batched server runs that many
    #: streams' steps in one call: artifacts "main.s2", ...; bitwise equal to one by one); () = none
    vocoder_streams: tuple = ()
    #: export only these components (default: all)
    components: tuple = COMPONENTS
    #: reuse the vocoder of another bundle (its plan entry, paths made relative to this bundle)
    vocoder_from: str | None = None
    #: SnakeBeta as qtts.kernels function nodes (qtts.export.snake): the compiled kernel where it
    #: is registered, the same plain ops (inlined) everywhere else; False: the plain graph
    vocoder_kernels: bool = True
    #: the int8 predictor frame's decoder layers as qtts.kernels::DecoderLayer function nodes
    #: (qtts.export.fuse): the compiled layer where it is registered, the plain ops elsewhere. Off in
    #: the presets: no faster inside the product's loop (docs/performance.md, "Compiled kernels")
    predictor_kernels: bool = False
    #: also write the batch graphs (dynamic batch talker, B-stream predictor frame) that a batched
    #: engine (qtts.engine.batching, `qtts serve --max-batch`) runs; artifacts["batch"] in the plan
    batch_graphs: bool = True
    #: storage of the gathered embedding tables (text, codec, predictor codec): "fp16" halves them
    #: (the 151936 x 2048 text embedding is 1.24 GB in fp32), "int8" (per-row scales) quarters
    #: them; rows are read back as fp32 (qtts.plans.plan.load_table)
    tables: str = "fp32"
    #: per-group precision rules over talker / predictor (``--mix``, :mod:`qtts.export.recipe`), e.g.
    #: "talker.first2=int8,predictor.heads9-15=int8"; "" = every weight at its component's precision
    mix: str = ""
    #: real-weight repairs of the quantized weights, comma-separated: "awq" (activation-aware scales
    #: folded into the preceding norm / projection, :mod:`qtts.export.awq`), "mse" (fitted block
    #: scales), "rotate" (Hadamard-rotated residual stream and MLP, :mod:`qtts.export.rotate`)
    repair: str = ""


# ---------------------------------------------------------------------------- per graph


def _kv_args(cfg, kv_len: int, embeds, t: int):
    """Example inputs and names of a GQA stack graph (talker or predictor step)."""
    import torch

    from .contrib import rope_tables
    from .graphs import kv_names

    n = cfg.num_hidden_layers
    cos, sin = rope_tables(kv_len, cfg.head_dim, cfg.rope_theta)
    past = [torch.zeros(1, cfg.num_key_value_heads, kv_len, cfg.head_dim) for _ in range(2 * n)]
    args = (embeds, torch.tensor([t - 1], dtype=torch.int32), torch.tensor(t, dtype=torch.int32), cos, sin, *past)
    inputs = ["embeds", "seqlens_k", "total_len", "cos_cache", "sin_cache", *kv_names(n, "past")]
    return args, inputs, kv_names(n, "present")


def _io(inputs, outputs, cfg, kv_len) -> dict:
    n = cfg.num_hidden_layers
    return {"inputs": inputs[:5] + [f"past_{{key,value}}_0..{n - 1}"], "outputs": outputs,
            "kv": [1, cfg.num_key_value_heads, kv_len, cfg.head_dim], "layers": n}  # fmt: skip


def export_talker(talker, path: str, rotate: bool = False) -> dict:
    """Talker prefill/step graph (``rotate``: :mod:`qtts.export.rotate`); returns its manifest description."""
    import torch

    from .graphs import TalkerGraph

    cfg = talker.cfg
    args, inputs, presents = _kv_args(cfg, 8, torch.zeros(1, 3, cfg.hidden_size), 3)
    dyn = {"embeds": {1: "T"}, "cos_cache": {0: "kv_len"}, "sin_cache": {0: "kv_len"}}
    dyn.update({name: {2: "kv_len"} for name in inputs[5:] + presents})
    graph = TalkerGraph(talker, rotate=rotate).eval()
    export_graph(graph, args, path, inputs, ["logits", "hidden", *presents], dyn, contrib=True)
    return _io(inputs, ["logits", "hidden"], cfg, "kv_len")


def export_predictor_step(talker, path: str, rotate: bool = False) -> dict:
    import torch

    from .graphs import PredictorStepGraph

    cfg = talker.code_predictor.cfg
    args, inputs, presents = _kv_args(cfg, PREDICTOR_SLOTS, torch.zeros(1, 2, talker.cfg.hidden_size), 2)
    heads = [f"logits_{j}" for j in range(PREDICTOR_STEPS)]
    graph = PredictorStepGraph(talker.code_predictor, rotate=rotate).eval()
    export_graph(graph, args, path, inputs, [*heads, *presents], {"embeds": {1: "T"}}, contrib=True)
    return _io(inputs, heads, cfg, PREDICTOR_SLOTS)


def export_predictor_frame(talker, path: str, table_dtype=None, rotate: bool = False) -> dict:
    import torch

    from .graphs import PredictorFrameGraph

    args = (torch.zeros(1, talker.cfg.hidden_size), torch.zeros(1, dtype=torch.int64), torch.zeros(PREDICTOR_STEPS),
            torch.ones(1), torch.ones(1, dtype=torch.int64), torch.ones(1), torch.zeros(1, dtype=torch.bool))  # fmt: skip
    inputs = ["hidden", "code0", "uniforms", "temperature", "top_k", "top_p", "do_sample"]
    graph = PredictorFrameGraph(talker, table_dtype=table_dtype, rotate=rotate).eval()
    export_graph(graph, args, path, inputs, ["codes", "logits"], {}, contrib=True)
    return {"inputs": inputs, "outputs": ["codes", "logits"]}


def export_text_projection(talker, path: str) -> dict:
    import torch

    from .graphs import TextProjectionGraph

    args = (torch.zeros(2, talker.cfg.text_hidden_size),)
    graph = TextProjectionGraph(talker).eval()
    export_graph(graph, args, path, ["rows"], ["embeds"], {"rows": {0: "n"}, "embeds": {0: "n"}})
    return {"inputs": ["rows"], "outputs": ["embeds"]}


# ---------------------------------------------------------------------------- bundle


def _graph_meta(cfg, **extra) -> dict:
    return {"layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, **extra}


def _quantized(export, talker, out: str, name: str, component: str, recipe, opts: ExportOptions):
    from .quantize import quantize_file
    from .recipe import label

    io = export(talker, os.path.join(out, name))
    entry = {"impl": "onnx", "artifacts": {"main": name}, "precision": label(recipe, component, talker)}
    return entry, io, quantize_file(os.path.join(out, name), component, recipe, opts.block_size)


def _phase(progress, name: str) -> None:
    if progress is not None:
        progress(name)


def export_generation(talker, out: str, opts: ExportOptions, progress=None, recipe=None) -> tuple[dict, dict, dict]:
    """Talker, predictor, text projection and tables -> (plan entries, graph meta, runtime files);
    ``progress(phase)`` is told each phase (:data:`qtts.plans.build.PHASES`); ``recipe``: the weights'
    precisions (default: the one ``opts`` asks for, :func:`qtts.export.recipe.for_talker`)."""
    cfg, pcfg = talker.cfg, talker.code_predictor.cfg
    if (pcfg.head_dim, pcfg.rope_theta) != (cfg.head_dim, cfg.rope_theta):
        raise InputError("talker and predictor RoPE differ; this exporter shares one table")
    if opts.predictor_mode not in PREDICTOR_MODES:
        raise InputError(f"unknown predictor mode '{opts.predictor_mode}'; use one of {', '.join(PREDICTOR_MODES)}")
    from .recipe import file_label, for_talker

    recipe = recipe or for_talker(talker, opts.talker, opts.predictor, opts.mix, opts.repair)
    rotate = "rotate" in recipe.repair
    plan, meta = {}, {}
    _phase(progress, "tables")
    files = write_tables(talker, out, opts.tables)
    _phase(progress, "text projection")
    export_text_projection(talker, os.path.join(out, "text_projection.onnx"))
    files["text_projection"] = "text_projection.onnx"
    if "talker" in opts.components:
        _phase(progress, "talker")
        name = f"talker.{file_label(recipe, 'talker', talker)}.onnx"
        fn = functools.partial(export_talker, rotate=rotate)
        plan["talker"], io, q = _quantized(fn, talker, out, name, "talker", recipe, opts)
        meta["talker"] = _graph_meta(cfg, io=io, quantization=q)
    if "predictor" in opts.components:
        _phase(progress, "predictor")
        mode = opts.predictor_mode
        fn = functools.partial(export_predictor_frame, table_dtype=_graph_tables(opts), rotate=rotate)
        fn = fn if mode == "frame" else functools.partial(export_predictor_step, rotate=rotate)
        name = f"predictor.{mode}.{file_label(recipe, 'predictor', talker)}.onnx"
        plan["predictor"], io, q = _quantized(fn, talker, out, name, "predictor", recipe, opts)
        meta["predictor"] = _graph_meta(pcfg, io=io, quantization=q, mode=mode, max_len=PREDICTOR_SLOTS)
        if mode == "frame" and opts.predictor_kernels:
            from .fuse import OP, fuse_layers

            meta["predictor"]["kernels"] = {f"qtts.kernels::{OP}": fuse_layers(os.path.join(out, name))}
            if not any(meta["predictor"]["kernels"].values()):
                log.warning("--predictor-kernels: no predictor layer has the kernel's layout (int8 block 128, "
                            "--repair rotate, widths multiples of 128); the plain layers are kept")  # fmt: skip
    if opts.batch_graphs:
        _phase(progress, "batch graphs")
        _batch_graphs(talker, out, opts, plan, meta, recipe)
    return plan, meta, files


def _graph_tables(opts: ExportOptions):
    """The dtype of the codec tables inside the predictor frame graphs: fp16 unless ``tables`` is fp32
    (ONNX has no int8 Gather of rows with scales in the default opset; fp16 rows cast to fp32)."""
    import torch

    return torch.float32 if opts.tables == "fp32" else torch.float16


def _batch_graphs(talker, out: str, opts: ExportOptions, plan: dict, meta: dict, recipe) -> None:
    """The batch graphs beside the one-stream ones (the predictor's only in frame mode)."""
    from .batch import export_batch_graphs
    from .quantize import quantize_file
    from .recipe import file_label

    precision = {"talker": file_label(recipe, "talker", talker)} if "talker" in plan else {}
    if "predictor" in plan and opts.predictor_mode == "frame":
        precision["predictor"] = file_label(recipe, "predictor", talker)
    from .vocoder import share_step_weights

    def quantize(path: str, component: str) -> dict:
        return quantize_file(path, component, recipe, opts.block_size)

    written = export_batch_graphs(talker, out, precision, quantize, table_dtype=_graph_tables(opts),
                                  rotate="rotate" in recipe.repair)  # fmt: skip
    for name, info in written.items():
        plan[name]["artifacts"]["batch"] = info["artifact"]
        meta[name]["batch"] = {"io": info["io"], "quantization": info["quantization"]}
        main = plan[name]["artifacts"]["main"]  # the same weights: one copy on disk for both graphs
        share_step_weights(out, [main, info["artifact"]], data_name=main[: -len(".onnx")] + ".weights", index_name=None)


def _encoders(snapshot: str, out: str, opts: ExportOptions) -> tuple[dict, dict]:
    """The speaker and speech encoders of a Base checkpoint (nothing for the others)."""
    from ..config import ModelConfig
    from ..weights import load_checkpoint
    from .encoders import export_speaker_encoder, export_speech_encoder

    if ModelConfig.from_dir(snapshot, speech_tokenizer=False).tts_model_type != "base":
        return {}, {}
    plan, meta = {}, {}
    for name, part, export in (("speaker_encoder", "speaker_encoder", export_speaker_encoder),
                               ("speech_encoder", "encoder", export_speech_encoder)):  # fmt: skip
        if name in opts.components:
            ckpt = load_checkpoint(snapshot, components=(part,))
            module = ckpt.model.speaker_encoder if part == "speaker_encoder" else ckpt.speech_tokenizer.encoder
            meta[name] = export(module, os.path.join(out, f"{name}.onnx"))
            plan[name] = {"impl": "onnx", "artifacts": {"main": f"{name}.onnx"}, "precision": "fp32"}
    return plan, meta


def _build(snapshot: str, out: str, final: str, opts: ExportOptions, progress=None) -> dict:
    """Everything ``opts`` asks for, written into ``out``; returns the plan."""
    from ..version import __version__
    from ..weights import load_checkpoint
    from .recipe import for_talker

    plan, meta, files, recipe, awq = {}, {}, {}, None, None
    if {"talker", "predictor"} & set(opts.components):
        _phase(progress, "checkpoint")
        talker = load_checkpoint(snapshot, components=("talker",)).model.talker
        recipe = for_talker(talker, opts.talker, opts.predictor, opts.mix, opts.repair)
        if "awq" in recipe.repair:
            from .awq import apply_awq

            _phase(progress, "calibration")
            awq = apply_awq(talker, snapshot, recipe, opts.block_size)
        plan, meta, files = export_generation(talker, out, opts, progress, recipe)
    _phase(progress, "encoders")
    enc_plan, enc_meta = _encoders(snapshot, out, opts)
    plan.update(enc_plan)
    meta.update(enc_meta)
    if "vocoder" in opts.components and opts.vocoder_main > 0:
        _phase(progress, "vocoder")
        plan["vocoder"], meta["vocoder"] = export_vocoder(snapshot, out, opts)
    elif opts.vocoder_from:
        plan["vocoder"] = borrowed_vocoder(opts.vocoder_from, final)
    manifest = {
        "qtts_version": __version__, "opset": OPSET, "graphs": meta, "runtime_files": files,
        "source": {**source_info(snapshot), "checkpoint_sha256": checkpoint_hash(snapshot)},
        "precision": {k: v.get("precision", "fp32") for k, v in plan.items()},
        "options": {"block_size": opts.block_size, "predictor_mode": opts.predictor_mode, "tables": opts.tables},
    }  # fmt: skip
    if recipe is not None:
        manifest["options"]["recipe"] = {**recipe.as_dict(), **({"awq": awq} if awq else {})}
    write_json(os.path.join(out, MANIFEST), manifest)
    write_json(os.path.join(out, PLAN), plan)
    return plan


def export_bundle(model_dir: str, out: str, opts: ExportOptions, overwrite: bool = False, progress=None) -> dict:
    """Export into a fresh bundle at ``out``; returns the plan (also written to plan.json).

    An existing non-empty ``out`` is refused unless ``overwrite`` (CLI ``--force``); then it is
    replaced as a whole, never mixed with the new files. ``progress(phase)``: told each phase.
    """
    from ..weights import resolve_snapshot
    from .recipe import make_recipe

    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"{out}: exists and is not a directory; choose another -o")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise InputError(f"{out}: the bundle directory exists and is not empty; pass --force to replace it")
    make_recipe(opts.talker, opts.predictor, opts.mix, opts.repair)  # bad syntax fails before any loading
    snapshot = resolve_snapshot(model_dir)  # after the output checks: a refusal costs no model lookup
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = temp_dir_beside(out, ".bundle.part")  # the umask's folder mode, unlike mkdtemp's 0700
    try:
        plan = _build(snapshot, tmp, out, opts, progress)
        _swap(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return plan


def _swap(new: str, out: str) -> None:
    """Put the finished directory ``new`` at ``out`` (the old one, if any, is removed after)."""
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old.", dir=os.path.dirname(out))
        os.replace(out, os.path.join(old, "bundle"))
    os.replace(new, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def borrowed_vocoder(bundle: str, out: str) -> dict:
    """The ``vocoder`` entry of another bundle's plan with artifact paths relative to ``out``."""
    spec = load_plan(os.path.join(bundle, PLAN)).get("vocoder")
    if spec.impl == "torch" or not spec.artifacts:
        raise InputError(f"{bundle}/{PLAN} has no exported vocoder to reuse")
    arts = {k: os.path.relpath(v, os.path.abspath(out)) for k, v in spec.artifacts.items()}
    return {"impl": spec.impl, "artifacts": arts, "precision": spec.precision or "fp32"}


def export_vocoder(snapshot: str, out: str, opts: ExportOptions) -> tuple[dict, dict]:
    """The streaming vocoder steps for the first and main chunk sizes, sharing one weight file."""
    from .snake import fuse_snake
    from .vocoder import export_vocoder_onnx, share_step_weights

    artifacts, meta = {}, {}
    for key, b in (("first", opts.vocoder_first), ("main", opts.vocoder_main)):
        if b <= 0 or (key == "first" and b == opts.vocoder_main):
            continue
        name = f"vocoder.b{b}.onnx"
        info = export_vocoder_onnx(snapshot, codes_length=b, out=os.path.join(out, name))
        artifacts[key] = name
        meta[key] = {k: info[k] for k in ("codes_length", "cache_size", "head_dim", "nodes") if k in info}
        for streams in opts.vocoder_streams if key == "main" else ():  # a 1-frame stacked step is not bitwise
            stacked = f"vocoder.b{b}.s{int(streams)}.onnx"
            export_vocoder_onnx(snapshot, codes_length=b, out=os.path.join(out, stacked), streams=int(streams))
            artifacts[f"{key}.s{int(streams)}"] = stacked
    for name in sorted(set(artifacts.values())) if opts.vocoder_kernels else ():
        fused = fuse_snake(os.path.join(out, name))
        meta.setdefault("kernels", {})[name] = {"qtts.kernels::SnakeBeta": fused}
    share_step_weights(out, sorted(set(artifacts.values())))
    return {"impl": "onnx", "artifacts": artifacts, "precision": "fp32"}, meta
