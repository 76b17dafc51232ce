"""The onnxruntime runtime: everything that runs an exported bundle, with no torch anywhere.

* generation: :class:`OnnxBackend`. Embeddings are numpy tables (memory-mapped ``.npy``); the text projection,
  talker and predictor are ONNX graphs (see :mod:`qtts.export.graphs`). Talker KV: one preallocated
  ``[1, kv_heads, max_len, head_dim]`` OrtValue per layer and kind, bound as *both* the past input and the
  present output of GroupQueryAttention (I/O binding), so each step writes only its new slots in place.
  Predictor: the fused frame graph (15 steps and the sampling in one run; host uniforms keep the loop's
  seeded random stream) or the per-step graph with a 17-slot in-place cache, fetching only ``logits_j``.
* vocoder: :class:`OnnxVocoder`, the ``main`` / ``first`` step graphs of ``qtts export vocoder`` (the step
  contract is read from the graph's metadata).
* encoders: :class:`OnnxSpeakerEncoder` (numpy log-mel + graph), :class:`OnnxSpeechEncoder`.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ..config import NUM_CODEBOOKS, PREDICTOR_STEPS
from ..errors import InputError, MissingDependencyError

try:  # a core dependency, imported at the top: this module is imported only when a plan names the onnx runtime
    import onnxruntime as ort
except ImportError as exc:  # a partial install
    raise MissingDependencyError("'onnxruntime' (a core dependency) is not installed; reinstall qtts: "
                                 'pip install -e . (in the qtts checkout)') from exc

from ..plans.plan import QuantTable, load_table, read_manifest
from .base import Backend, OpenContext
from .vocoder_step import STEP_INPUTS, STEP_OUTPUTS, StepContract, StepVocoder, pair_contracts

log = logging.getLogger(__name__)

DEFAULT_THREADS = 2
SPIN_US = 5  #: how long (us) an idle intra-op worker spins before it sleeps; QTTS_SPIN_US overrides
SPIN_ENV = "QTTS_SPIN_US"


def session_options(threads: int | None = None, spinning: bool = False, affinity: str | None = None):
    """ORT session options used for every graph: full graph optimization, ``threads`` intra-op.

    Idle workers spin at most :data:`SPIN_US` us before they sleep (``spinning=True``: unbounded):
    waking a sleeping worker costs ~10 us a node of ~2200 per predictor frame, a long spin steals the
    cores from the next session and other processes (docs/performance.md, "Spinning": -4 % RTF
    idle, +4 % beside a busy core). No memory arena or patterns: the arena keeps every session's
    peak activations (+100 MB RSS, same RTF). ``affinity``: the workers' CPUs (qtts.backends.Placement).
    """
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = int(threads or DEFAULT_THREADS)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_cpu_mem_arena = False
    so.enable_mem_pattern = False
    spin_us = os.environ.get(SPIN_ENV, "").strip() or str(SPIN_US)
    if not spin_us.isdecimal():
        raise InputError(f"{SPIN_ENV}={spin_us!r} is not a whole number of microseconds; set it to 0 (no spinning) "
                         f"or a bound such as {SPIN_US}, or unset it")  # fmt: skip
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0" if int(spin_us) == 0 else "1")
        so.add_session_config_entry("session.intra_op.spin_duration_us", str(int(spin_us)))
    if affinity:
        so.add_session_config_entry("session.intra_op_thread_affinities", affinity)
    return so


def open_session(path: str, threads: int | None = None, spinning: bool = False, options=None):
    """A CPU session of ``path`` with :func:`session_options` (or the given ``options``)."""
    if not os.path.isfile(path):
        raise InputError(f"ONNX artifact '{path}' not found; re-run 'qtts export onnx' or fix the plan")
    return ort.InferenceSession(path, options or session_options(threads, spinning), providers=["CPUExecutionProvider"])


class KVBinding:
    """Preallocated per-layer KV OrtValues bound as GQA past *and* present of one session."""

    def __init__(self, session, layers: int, shape: tuple, cos: np.ndarray, sin: np.ndarray, outputs: list):
        self.io = session.io_binding()
        self.session = session
        self.buffers = []
        for i in range(layers):
            for kind in ("key", "value"):
                # uninitialized: GQA reads only written slots < total_len (zeroing a 0.6B talker's 235 MB: +150 ms)
                buf = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32)
                self.io.bind_ortvalue_input(f"past_{kind}_{i}", buf)
                self.buffers.append((f"present_{kind}_{i}", buf))
        self.cos, self.sin = cos, sin  # kept alive: bound by pointer
        self.io.bind_cpu_input("cos_cache", cos)
        self.io.bind_cpu_input("sin_cache", sin)
        self.max_len = shape[2]
        self.bind_outputs(outputs)

    def bind_outputs(self, names: list) -> None:
        """Fetch ``names`` (``run`` returns them first, in this order); presents stay in place."""
        self.io.clear_binding_outputs()
        for name in names:  # io.get_outputs() keeps the binding order
            self.io.bind_output(name)
        for name, buf in self.buffers:
            self.io.bind_ortvalue_output(name, buf)

    def run(self, embeds: np.ndarray, pos: int) -> list:
        t = embeds.shape[1]
        if pos < 0 or pos + t > self.max_len:
            raise InputError(f"positions {pos}..{pos + t - 1} do not fit a KV state of {self.max_len} slots")
        self.io.bind_cpu_input("embeds", embeds)
        self.io.bind_cpu_input("seqlens_k", np.array([pos + t - 1], dtype=np.int32))
        self.io.bind_cpu_input("total_len", np.array(pos + t, dtype=np.int32))
        self.session.run_with_iobinding(self.io)
        return self.io.get_outputs()


def _resident(table):
    """A small table read into memory (an int8 table keeps its int8 rows and scales)."""
    if isinstance(table, QuantTable):
        return QuantTable(np.ascontiguousarray(table.data), np.ascontiguousarray(table.scale))
    return np.ascontiguousarray(table)


class OnnxBackend(Backend):
    """Talker + predictor in onnxruntime; implements :class:`~qtts.backends.base.Backend`."""

    def __init__(self, artifacts: dict, meta: dict, threads: int | None = None, affinity: str | None = None):
        """``artifacts``: absolute paths (talker, predictor, text_projection, tables); ``meta``: manifest
        graph info; ``affinity``: the sessions' workers' CPUs (:class:`qtts.backends.Placement`)."""
        self.threads = threads
        self.meta = meta
        load = lambda key: load_table(artifacts[key])  # noqa: E731  (fp32, fp16 or int8 + scales: qtts.plans.plan)
        self.text_table = load("text_embedding")  # mapped; rows are read back as fp32 when gathered
        self.codec_table = _resident(load("codec_embedding"))
        self.predictor_tables = _resident(load("predictor_codec_embedding"))
        self.rope_cos, self.rope_sin = load("rope_cos"), load("rope_sin")
        self.hidden_size = int(self.codec_table.shape[1])
        options = lambda: session_options(threads, False, affinity)  # noqa: E731
        self.text_proj = open_session(artifacts["text_projection"], options=options())
        self.talker_sess = open_session(artifacts["talker"], options=options())
        self.predictor_mode = meta["predictor"]["mode"]
        path, fused = artifacts["predictor"], any(meta["predictor"].get("kernels", {}).values())  # qtts.export.fuse
        so = kernel_options(path, threads, None, True) if fused else options()
        self.predictor_sess = open_session(path, options=so)
        self._pred_binding = None

    # -- embeddings (numpy tables + the text projection graph) ----------------------------------------
    def text_embeds(self, ids: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(self.text_table[np.asarray(ids, dtype=np.int64).reshape(-1)], dtype=np.float32)
        if len(rows) == 0:
            return np.zeros((0, self.hidden_size), np.float32)
        return self.text_proj.run(None, {"rows": rows})[0]

    def codec_embeds(self, ids: np.ndarray) -> np.ndarray:
        return self.codec_table[np.asarray(ids, dtype=np.int64).reshape(-1)].astype(np.float32, copy=False)

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.int64).reshape(-1, NUM_CODEBOOKS)
        parts = [self.codec_table[codes[:, 0]]]
        parts += [self.predictor_tables[j][codes[:, j + 1]] for j in range(codes.shape[1] - 1)]
        return np.stack(parts, axis=1).sum(axis=1, dtype=np.float32)

    # -- talker ----------------------------------------------------------------------------------------
    def new_state(self, max_len: int) -> KVBinding:
        """One generation's talker KV: preallocated OrtValues and their I/O binding."""
        t = self.meta["talker"]
        max_len = int(max_len)
        if max_len > len(self.rope_cos):
            raise InputError(f"max_len {max_len} exceeds the talker's {len(self.rope_cos)} positions")
        shape = (1, t["kv_heads"], max_len, t["head_dim"])
        cos, sin = (np.ascontiguousarray(table[:max_len]) for table in (self.rope_cos, self.rope_sin))
        return KVBinding(self.talker_sess, t["layers"], shape, cos, sin, ["logits", "hidden"])

    def talker(self, embeds: np.ndarray, pos: int, state: KVBinding):
        x = np.ascontiguousarray(np.asarray(embeds, dtype=np.float32)[None])
        logits, hidden = state.run(x, int(pos))[:2]
        return logits.numpy()[0], hidden.numpy()[0], state

    # -- predictor -------------------------------------------------------------------------------------
    def predict_frame(self, hidden: np.ndarray, code0: int, sampler, uniforms: np.ndarray) -> np.ndarray:
        if self.predictor_mode == "frame":
            return self._predict_fused(hidden, code0, sampler.params, uniforms)
        return self._predict_steps(hidden, code0, sampler, uniforms)

    def predictor_logits(self, hidden, code0: int, sampler, uniforms):
        """(codes [15], logits [15, vocab]) of one frame, for ``qtts verify plan``; None when the
        graph has no logits output (step mode, bundles exported before it had one)."""
        names = {o.name for o in self.predictor_sess.get_outputs()}
        if self.predictor_mode != "frame" or "logits" not in names:
            return None
        feeds = self._fused_feeds(hidden, code0, sampler.params, uniforms)
        codes, logits = self.predictor_sess.run(["codes", "logits"], feeds)
        return codes.astype(np.int64), logits

    def _predict_fused(self, hidden, code0, params, uniforms) -> np.ndarray:
        feeds = self._fused_feeds(hidden, code0, params, uniforms)
        return self.predictor_sess.run(["codes"], feeds)[0].astype(np.int64)

    def _fused_feeds(self, hidden, code0, params, uniforms) -> dict:
        vocab = int(self.predictor_tables.shape[1])
        top_k = int(params.top_k) if params.top_k else vocab
        return {
            "hidden": np.asarray(hidden, dtype=np.float32).reshape(1, -1),
            "code0": np.array([int(code0)], dtype=np.int64),
            "uniforms": np.asarray(uniforms, dtype=np.float32).reshape(PREDICTOR_STEPS),
            "temperature": np.array([params.temperature or 1.0], dtype=np.float32),
            "top_k": np.array([min(max(top_k, 1), vocab)], dtype=np.int64),
            "top_p": np.array([1.0 if params.top_p is None else params.top_p], dtype=np.float32),
            "do_sample": np.array([bool(params.do_sample)]),
        }

    def _predict_steps(self, hidden, code0, sampler, uniforms) -> np.ndarray:
        p = self.meta["predictor"]
        if self._pred_binding is None:
            shape = (1, p["kv_heads"], p["max_len"], p["head_dim"])
            cos, sin = (np.ascontiguousarray(table[: p["max_len"]]) for table in (self.rope_cos, self.rope_sin))
            self._pred_binding = KVBinding(self.predictor_sess, p["layers"], shape, cos, sin, [])
        binding = self._pred_binding
        h = np.asarray(hidden, dtype=np.float32).reshape(1, 1, -1)

        def step_logits(j: int, code: int) -> np.ndarray:
            if j == 0:
                x, pos = np.concatenate([h, self.codec_table[[code]][None]], axis=1), 0
            else:
                x, pos = self.predictor_tables[j - 1][[code]][None], j + 1
            binding.bind_outputs([f"logits_{j}"])
            return binding.run(np.ascontiguousarray(x, dtype=np.float32), pos)[0].numpy()[0]

        return sampler.frame(step_logits, code0, uniforms)


class OnnxSpeakerEncoder:
    """x-vector from a mono 24 kHz waveform: numpy log-mel (:func:`qtts.audio.mel.log_mel`) + the ONNX encoder."""

    def __init__(self, path: str, threads: int | None = None):
        self.session = open_session(path, threads)

    def embed(self, wav_24k: np.ndarray) -> np.ndarray:
        from ..audio.mel import log_mel

        mel = np.ascontiguousarray(log_mel(wav_24k), dtype=np.float32)[None]
        return self.session.run(["embedding"], {"mel": mel})[0][0]


class OnnxSpeechEncoder:
    """Reference codes for ICL cloning: mono 24 kHz waveform -> ``[ceil(N/1920), 16]`` int64."""

    def __init__(self, path: str, threads: int | None = None):
        self.session = open_session(path, threads)

    def encode(self, wav_24k: np.ndarray) -> np.ndarray:
        wav = np.ascontiguousarray(wav_24k, dtype=np.float32).reshape(1, -1)
        codes = self.session.run(["codes"], {"wav": wav})[0]  # [1, 16, frames]
        return np.ascontiguousarray(codes[0].T, dtype=np.int64)


class SharedWeights:
    """The one weight file of a bundle's vocoder steps (``qtts.export.vocoder.share_step_weights``).

    Every tensor is memory-mapped once and handed to every step session as the same buffer
    (``add_initializer``), with prepacking off in those sessions (prepacking would copy the
    MatMul and ConvTranspose weights per session): one copy of the weights instead of one per
    step size. Bundles written before have no index and load as before, one copy per session.
    """

    INDEX = "vocoder.shared.json"

    def __init__(self, directory: str, index: dict):
        data = os.path.join(directory, index["data"])
        self.graphs = index["graphs"]
        self.values = {  # OrtValues over the mapping (no copy); they live as long as the vocoder
            key: ort.OrtValue.ortvalue_from_numpy(np.memmap(data, dtype=np.dtype(t["dtype"]), mode="r",
                                                            offset=int(t["offset"]), shape=tuple(t["shape"])))
            for key, t in index["tensors"].items()
        }  # fmt: skip

    @classmethod
    def find(cls, paths: list) -> SharedWeights | None:
        """The index beside the step graphs when it lists all of them, else None (an older bundle)."""
        directory = os.path.dirname(os.path.abspath(paths[0]))
        index_path = os.path.join(directory, cls.INDEX)
        if not os.path.isfile(index_path):
            return None
        with open(index_path, encoding="utf-8") as fh:
            index = json.load(fh)
        names = [os.path.basename(p) for p in paths]
        same_dir = all(os.path.dirname(os.path.abspath(p)) == directory for p in paths)
        return cls(directory, index) if same_dir and all(n in index["graphs"] for n in names) else None

    def options(self, path: str, threads: int | None):
        so = session_options(threads)
        so.add_session_config_entry("session.disable_prepacking", "1")
        for name, key in self.graphs[os.path.basename(path)].items():
            so.add_initializer(name, self.values[key])
        return so


def kernel_options(path: str, threads: int | None, shared: SharedWeights | None = None, layers: bool = False):
    """Session options with the compiled kernels of :mod:`qtts.kernels` where it has them (a vocoder
    step's SnakeBeta; with ``layers`` the predictor frame's DecoderLayer, on ``threads`` threads), else
    the graph's ``qtts.kernels`` function nodes are inlined to the plain ops (a plain export's output,
    bit for bit); for a vocoder step, its shared weights. Never unbounded spinning beside the layer op:
    idle onnxruntime workers would hold the cores its threads need."""
    from ..kernels import register, set_layer_threads

    so = shared.options(path, threads) if shared else session_options(threads)
    if register(so) and layers:
        set_layer_threads(int(threads or DEFAULT_THREADS))
    return so


class OnnxVocoder(StepVocoder):
    """onnxruntime sessions of the ``main`` and optional ``first`` vocoder step graphs (built once),
    and of optional ``stacked`` steps (several streams per call, for :meth:`run_batch`)."""

    def __init__(self, main: str, first: str | None = None, threads: int | None = None, session_factory=None,
                 stacked: tuple = ()):  # fmt: skip
        paths = [main] + ([first] if first else []) + list(stacked)
        self.shared = None if session_factory else SharedWeights.find(paths)
        shared = self.shared
        make = session_factory or (lambda path: open_session(path, options=kernel_options(path, threads, shared)))
        sessions = {p: make(p) for p in paths}
        contracts = {p: session_contract(s, p) for p, s in sessions.items()}
        self.contract = pair_contracts(contracts, main)
        self.sessions = {contracts[p].codes_length: s for p, s in sessions.items() if contracts[p].streams == 1}
        self.stacked = {(c.codes_length, c.streams): sessions[p] for p, c in contracts.items() if c.streams > 1}
        self.sizes = sorted(self.sessions, reverse=True)

    def run(self, size, codes, freqs, valid, cache):
        feeds = dict(zip(STEP_INPUTS, (codes, freqs, valid, cache)))
        audio, cache = self.sessions[size].run(list(STEP_OUTPUTS), feeds)
        return audio, cache

    def run_batch(self, size, codes, freqs, valid, cache):
        """The stacked steps of ``size`` in as few calls as the stacked graphs allow (largest first),
        the rest one by one; bitwise the same either way on the CPU."""
        counts = sorted((s for b, s in self.stacked if b == size), reverse=True)
        if not counts:
            return super().run_batch(size, codes, freqs, valid, cache)
        audio, caches, i, n = [], [], 0, len(codes)
        while i < n:
            s = next((c for c in counts if c <= n - i), 1)
            if s == 1:
                a, c = self.run(size, codes[i], freqs[i], valid[i], cache[i])
            else:
                feeds = dict(zip(STEP_INPUTS, (codes[i : i + s], freqs[i : i + s], valid[i : i + s], cache[i : i + s])))
                a, c = self.stacked[(size, s)].run(list(STEP_OUTPUTS), feeds)
            audio.append(np.asarray(a, dtype=np.float32).reshape(s, -1))
            caches.append(np.asarray(c, dtype=np.float32).reshape(s, -1))
            i += s
        return np.concatenate(audio), np.concatenate(caches)


def session_contract(session, path: str) -> StepContract:
    """The step contract (B, N, head_dim, ...) of a vocoder step session, from the graph metadata."""
    dims = {i.name: list(i.shape) for i in session.get_inputs()}
    missing = [n for n in STEP_INPUTS if n not in dims]
    if missing:
        raise InputError(
            f"{path}: not a qtts vocoder step (missing inputs {missing}); export one with `qtts export vocoder`"
        )
    meta = session.get_modelmeta().custom_metadata_map
    if "qtts.step_contract" not in meta:
        raise InputError(f"{path}: no qtts.step_contract metadata; re-export it with `qtts export vocoder`")
    contract = StepContract.from_dict(json.loads(meta["qtts.step_contract"]), path)
    lead = [contract.streams] if contract.streams > 1 else []  # a stacked step: a stream axis first
    shape_ok = (
        dims["audio_codes"] == lead + [1, contract.num_quantizers, contract.codes_length]
        and dims["freqs_in"] == lead + [contract.codes_length, contract.head_dim // 2]
        and dims["cache_in"] == lead + [contract.cache_size]
    )
    if not shape_ok:
        raise InputError(f"{path}: graph input shapes {dims} disagree with its metadata {contract}")
    return contract


# ----------------------------------------------------------------------------- openers
def open_generation(talker_spec, predictor_spec, ctx: OpenContext) -> OnnxBackend:
    """The bundle manifest lies next to the talker graph and names the tables and the text projection."""
    if talker_spec.impl != "onnx" or predictor_spec.impl != "onnx":
        raise InputError("an onnx plan must name both 'talker' and 'predictor' (impl: onnx)")
    bundle = os.path.dirname(talker_spec.artifacts["main"])
    manifest = read_manifest(bundle)
    artifacts = {k: os.path.join(bundle, v) for k, v in manifest["runtime_files"].items()}
    artifacts.update(talker=talker_spec.artifacts["main"], predictor=predictor_spec.artifacts["main"])
    threads = talker_spec.options.get("threads", ctx.threads)
    return OnnxBackend(artifacts, dict(manifest["graphs"]), threads, ctx.placement and ctx.placement.worker_affinity(threads))


def open_vocoder(spec, ctx: OpenContext) -> OnnxVocoder:
    """Plan options: ``threads``. Artifacts ``first.sN`` / ``main.sN``: stacked steps (N streams per call)."""
    stacked = tuple(v for k, v in sorted(spec.artifacts.items()) if k.startswith(("first.s", "main.s")))
    return OnnxVocoder(spec.artifacts["main"], spec.artifacts.get("first"), spec.options.get("threads", ctx.threads),
                       stacked=stacked)


OPENERS = {
    "generation": open_generation,
    "vocoder": open_vocoder,
    "speaker_encoder": lambda spec, ctx: OnnxSpeakerEncoder(spec.artifacts["main"], ctx.threads),
    "speech_encoder": lambda spec, ctx: OnnxSpeechEncoder(spec.artifacts["main"], ctx.threads),
}
