"""Runtimes by implementation, and the one place where a model's parts are built.

``backends/<impl>.py`` owns everything that runtime executes: its generation backend (the seam of
:mod:`qtts.backends.base`), its streaming vocoder, its encoders and its session helpers.
:func:`open` reads a snapshot and an execution plan and builds each part once, with the runtime
the plan names (torch where it names none), into :class:`Components`, the way piper builds
``PiperVoice(config, session)``; :class:`qtts.TTS` takes the Components. Runtime modules are
imported only when a plan names them: an ONNX plan never imports torch.

The parts are built with the process resources they run on: intra-op threads (:func:`default_threads`)
and 2 MB pages for the weights onnxruntime holds (Linux; best effort). onnxruntime prepacks every
MatMulNBits weight into anonymous memory, on 4 KB pages where transparent huge pages are ``madvise``-only
(a common default): a GEMV streaming ~0.5 GB a step pays a TLB miss every 4 KB and a prefetcher stopping
at every page edge. Once an onnx plan's parts are built, :func:`advise_huge_pages` asks for 2 MB pages and
collapses the large, almost fully resident anonymous mappings now (Linux >= 6.1; a sparse one never grows).
Zen 4 VM: the frame -21 %, the same RSS (docs/performance.md). ``QTTS_HUGE_PAGES=0`` turns it off.

Where the process may run on exactly two CPUs, :func:`open` picks a :class:`Placement` for a pipelined
stream: its generation thread alone on the first CPU, onnxruntime's workers and the decoding on the
second, so the scheduler never hands the CPU every frame waits on to the decoder (Zen 4 VM: ~3-4 % of RTF,
the same bits; docs/performance.md, "Placement"). Only with onnxruntime generation on one or two threads
without the compiled predictor layer, one stream per engine (``max_batch`` 1), the decoding only with a
one-thread vocoder (the bf16 step), one placed stream per process (two processes would both use the
first CPU). ``QTTS_PIN=0`` turns it off.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import ModelConfig
from ..errors import InputError
from ..plans import plan as _plans
from ..plans.plan import Plan, check_plan_source, load_plan, names_torch, read_manifest, with_bf16_vocoder
from .base import Backend, OpenContext, Vocoder

__all__ = ["PARTS", "Backend", "Components", "LazyPart", "Placement", "Vocoder", "advise_huge_pages",
           "default_threads", "open"]  # fmt: skip

log = logging.getLogger(__name__)

#: talker hidden sizes below this are test-sized checkpoints (the tiny random ones are 32 / 64)
TINY_HIDDEN = 256
#: the parts :func:`open` can build (``parts=``); a Components built without one has None there
PARTS = ("generation", "vocoder", "speaker_encoder", "speech_encoder")
#: intra-op threads for real sizes: more than 4 buys nothing for batch-1 steps (docs/history/performance.md)
MAX_THREADS = 4
#: the switch of :func:`advise_huge_pages` (0 / off / no / false: 4 KB pages, as onnxruntime leaves them)
HUGE_PAGES_ENV = "QTTS_HUGE_PAGES"
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
#: mappings smaller than this are not worth a huge page (numpy advises its own large arrays)
HUGE_PAGES_MIN_BYTES = 4 << 20
#: only mappings at least this resident are collapsed (collapsing fills the holes of a mapping)
HUGE_PAGES_MIN_RESIDENT = 0.9
_pages_lock = threading.Lock()
#: the switch of :class:`Placement` (0 / off / no / false: threads run where the scheduler puts them)
PIN_ENV = "QTTS_PIN"
_placed_lock = threading.Lock()
_PLACED: list = []  # the one placed stream's Placement (the process's engines share its CPUs)


def default_threads(config: ModelConfig) -> int:
    """Intra-op threads when the caller sets none: 1 for tiny checkpoints (their per-step tensors
    are so small that a thread pool costs more than it saves: 10x slower than one thread on a busy
    2-core machine), else the core count capped at :data:`MAX_THREADS`."""
    if config.talker.hidden_size < TINY_HIDDEN:
        return 1
    return max(1, min(os.cpu_count() or 1, MAX_THREADS))


@dataclass(frozen=True)
class Components:
    """Everything a :class:`qtts.TTS` runs on, built once by :func:`open` (or by hand in tests)."""

    config: ModelConfig
    tokenizer: Any  # text -> ids (qtts.text.tokenizer.TextTokenizer); None when built without generation
    backend: Backend | None  # talker + predictor: the generation seam (None: built without it)
    vocoder: Vocoder | None  # .stream(): a fresh stateful streaming decoder per utterance
    speaker_encoder: Any = None  # .embed(wav_24k) -> x-vector; Base checkpoints only
    speech_encoder: Any = None  # .encode(wav_24k) -> reference codes; Base checkpoints only
    plan: Plan = field(default_factory=Plan)
    threads: int | None = None  # the intra-op threads every part was built with
    #: streams stepped together by one engine (qtts.engine.batching); 1 = one generation per call, no thread
    max_batch: int = 1
    snapshot: str | None = None  # the checkpoint directory (None: built by hand); codes files name its codec
    #: which CPU a pipelined stream's threads run on; None: anywhere
    placement: Placement | None = None

    @property
    def thread_safe(self) -> bool:
        """Concurrent generations are safe when the backend says so (the vocoder is per stream)."""
        return self.backend is not None and bool(self.backend.thread_safe)


def open(model: str, plan=None, dtype: str = "float32", threads: int | None = None,  # noqa: A001
         backend: Backend | None = None, parts=None, max_batch: int = 1) -> Components:
    """Build every part of ``model`` (a snapshot dir or hub id) once, with the runtimes ``plan`` names.

    ``plan``: None (``$QTTS_PLAN``, else the default preset, built and cached when missing), ``"torch"``
    (the empty plan, no cache), a preset name, a path, a dict or a :class:`~qtts.plans.plan.Plan`
    (:func:`qtts.plans.cache.resolve_plan`); ``threads``: None picks :func:`default_threads`;
    ``backend``: a prebuilt generation backend (injection, like kokoro-onnx ``from_session``) instead of
    the plan's talker and predictor; ``parts``: which of :data:`PARTS` to build, None = all (the others
    are None: ``("vocoder",)`` loads no talker); ``max_batch``: streams one engine steps together."""
    from ..text.tokenizer import TextTokenizer

    want = _wanted(parts)
    snapshot = snapshot_dir(model)
    config = ModelConfig.from_dir(snapshot)
    plan, preset = (Plan(), None) if names_torch(plan) else _resolved(plan, snapshot, dtype, backend)
    if int(max_batch) < 1:
        raise InputError(f"max_batch must be >= 1, got {max_batch}")
    ctx = OpenContext(snapshot, config, dtype, threads or default_threads(config), max_batch=int(max_batch))
    clones = config.tts_model_type == "base"
    generates = "generation" in want or backend is not None
    placed = "generation" in want and backend is None  # the CPUs of a pipelined stream's threads
    ctx.placement = Placement.for_plan(plan, ctx.threads, ctx.max_batch) if placed else None
    _import_torch_meanwhile(plan, preset)
    generation = backend or (_generation(plan, ctx) if generates else None)
    plan = with_bf16_vocoder(plan, preset)  # the talker and predictor are the bundle's either way
    if ctx.placement is not None:  # where the decoding runs follows the vocoder chosen
        ctx.placement = Placement.for_plan(plan, ctx.threads, ctx.max_batch)
    components = Components(
        config=config, tokenizer=TextTokenizer.from_dir(snapshot) if generates else None,
        backend=generation, vocoder=_part("vocoder", plan, ctx) if "vocoder" in want else None,
        speaker_encoder=_lazy_part("speaker_encoder", plan, ctx) if clones and "speaker_encoder" in want else None,
        speech_encoder=_lazy_part("speech_encoder", plan, ctx) if clones and "speech_encoder" in want else None,
        plan=plan, threads=ctx.threads, max_batch=ctx.max_batch, snapshot=snapshot, placement=ctx.placement,
    )  # fmt: skip
    if any(plan.impl(name) == "onnx" for name in ("talker", "predictor", "vocoder")):
        advise_huge_pages()  # 2 MB pages for the weights onnxruntime prepacked (module docstring)
    return components


def huge_pages_enabled() -> bool:
    """False off Linux, when ``QTTS_HUGE_PAGES`` is 0 / off / no / false, or when the kernel's
    transparent huge pages are ``never``."""
    if not sys.platform.startswith("linux"):
        return False
    if _switched_off(HUGE_PAGES_ENV):
        return False
    return thp_mode() in ("always", "madvise")


def _switched_off(env: str) -> bool:
    """True when the switch ``env`` is 0 / off / no / false (any case, spaces ignored)."""
    return os.environ.get(env, "").strip().lower() in ("0", "off", "no", "false")


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode (always / madvise / never), None where unknown
    (``builtins.open``: this module's :func:`open` builds parts)."""
    try:
        with builtins.open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def huge_page_candidates(min_bytes: int = HUGE_PAGES_MIN_BYTES,
                         min_resident: float = HUGE_PAGES_MIN_RESIDENT) -> list[tuple[int, int]]:  # fmt: skip
    """(start, length) of this process's anonymous read-write mappings (and the heap) of at least
    ``min_bytes`` whose resident share is at least ``min_resident`` (from /proc/self/smaps)."""
    out, current = [], None
    with builtins.open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                anon = len(head) == 5 or head[5] == "[heap]"
                current = (lo, hi - lo) if anon and head[1].startswith("rw") and hi - lo >= min_bytes else None
            elif current and head[0] == "Rss:":
                if int(head[1]) * 1024 >= min_resident * current[1]:
                    out.append(current)
                current = None
    return out


def advise_huge_pages(min_bytes: int = HUGE_PAGES_MIN_BYTES) -> int:
    """Ask for 2 MB pages over :func:`huge_page_candidates` and collapse them now; the bytes advised
    (0 when :func:`huge_pages_enabled` is False or the kernel refuses)."""
    if not huge_pages_enabled():
        return 0
    with _pages_lock:
        t0, done = time.perf_counter(), 0
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            for start, length in huge_page_candidates(min_bytes):
                if libc.madvise(start, length, MADV_HUGEPAGE) == 0:
                    libc.madvise(start, length, MADV_COLLAPSE)  # older kernels: EINVAL, khugepaged does it later
                    done += length
        except (OSError, AttributeError, ValueError) as exc:  # no libc madvise, no /proc: nothing to do
            log.debug("huge pages not advised: %s", exc)
            return 0
        log.debug("huge pages: %.0f MB advised in %.2f s", done / 2**20, time.perf_counter() - t0)
        return done


class LazyPart:
    """A part built on first use (the encoders, which only cloning needs: ~225 MB of ONNX at 0.6B).
    Attribute access builds it once (thread-safe) and forwards; plan and artifact errors surface at load."""

    def __init__(self, build):
        self._build, self._part, self._lock = build, None, threading.Lock()

    def get(self):
        with self._lock:
            if self._part is None:
                self._part = self._build()
        return self._part

    def __getattr__(self, name: str):
        if name.startswith("_"):  # our own fields before __init__ ran (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.get(), name)


def _wanted(parts) -> set:
    if parts is None:
        return set(PARTS)
    want = {parts} if isinstance(parts, str) else set(parts)
    unknown = sorted(want - set(PARTS))
    if unknown:
        raise InputError(f"unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}")
    return want


def snapshot_dir(model) -> str:
    """A local snapshot directory as is (no torch import); hub ids through qtts.weights."""
    if os.path.isdir(model):
        return os.path.abspath(model)
    from ..weights import resolve_snapshot

    return resolve_snapshot(model)


def _resolved(plan, snapshot: str, dtype: str, backend) -> tuple[Plan, str | None]:
    """Any plan but an explicit torch one via the plan cache, and its bundle's preset (or None). None and
    presets: this checkpoint's bundle, found by fingerprint (built when missing); a named plan is checked."""
    from ..plans.cache import ENV_PLAN, preset_name, read_info, resolve_plan

    named = plan if plan is not None else os.environ.get(ENV_PLAN) or None
    resolved = load_plan(resolve_plan(plan, snapshot, dtype, backend))
    if resolved.path is not None and named is not None and preset_name(named) is None:
        check_plan_source(resolved, snapshot)
    if resolved.path is None:
        return resolved, None
    return resolved, read_info(os.path.dirname(resolved.path)).get("preset")


def _import_torch_meanwhile(plan: Plan, preset: str | None) -> None:
    """Where the bf16 vocoder may be chosen, torch's ~1-1.5 s of imports on a thread while onnxruntime builds
    the generation sessions (releasing the GIL): a cold load ~1 s sooner; a failed import fails again later."""
    if _plans.bf16_vocoder_fits(plan, preset) and _plans.bf16_vocoder_may_run_here():
        threading.Thread(target=_import_torch, name="qtts-import-torch", daemon=True).start()


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as exc:
        log.debug("torch did not import in the background: %s", exc)


def _generation(plan: Plan, ctx: OpenContext) -> Backend:
    """Talker and predictor run in one runtime; a torch talker may pair with a qnn predictor."""
    talker, predictor = plan.get("talker"), plan.get("predictor")
    impls = {talker.impl, predictor.impl} - {"torch"} or {"torch"}
    if len(impls) != 1:
        raise InputError(
            f"the plan mixes runtimes for talker and predictor ({', '.join(sorted(impls))}); "
            "use the same impl for both"
        )
    impl = impls.pop()
    if impl == "onnx" and ctx.max_batch > 1:  # a batched engine: the bundle's batch graphs
        from .onnx_batch import open_generation

        return open_generation(talker, predictor, ctx)
    return _opener(impl, "generation")(talker, predictor, ctx)


def _part(name: str, plan: Plan, ctx: OpenContext):
    spec = plan.get(name)
    return _opener(spec.impl, name)(spec, ctx)


def _lazy_part(name: str, plan: Plan, ctx: OpenContext) -> LazyPart:
    spec = plan.get(name)
    opener = _opener(spec.impl, name)  # a runtime that cannot run this part fails at load, not at first use
    return LazyPart(lambda: opener(spec, ctx))


def _opener(impl: str, part: str):
    openers = _runtime(impl).OPENERS
    if part not in openers:
        raise InputError(f"impl '{impl}' cannot run the {part}; it runs: {', '.join(sorted(openers))}")
    return openers[part]


def _runtime(impl: str):
    """The runtime module of a plan impl, imported only now (the optional extras stay optional)."""
    if impl == "torch":
        from . import torch as module
    elif impl == "onnx":
        from . import onnx as module
    elif impl == "rknn":
        from . import rknn as module
    elif impl == "qnn":
        from . import qnn as module
    elif impl == "executorch":
        from . import executorch as module
    else:
        raise InputError(f"unknown impl '{impl}'; valid: torch, onnx, rknn, qnn, executorch")
    return module


class Placement:
    """The two CPUs of a pipelined stream where the process has exactly two (module docstring):
    ``generation`` for its generation thread alone, ``shared`` for onnxruntime's talker and predictor
    workers and, with ``pin_decode`` (a one-thread vocoder: the bf16 step), the decoding thread."""

    def __init__(self, generation: int, shared: int, pin_decode: bool):
        self.generation, self.shared, self.pin_decode = int(generation), int(shared), bool(pin_decode)

    @classmethod
    def for_plan(cls, plan, threads: int, max_batch: int, cpus: list[int] | None = None) -> Placement | None:
        """The placement for ``plan``, ``threads`` and ``max_batch``; None where it does not apply."""
        cpus = sorted((os.sched_getaffinity(0) if sys.platform.startswith("linux") else ()) if cpus is None else cpus)
        if len(cpus) != 2 or int(max_batch) > 1 or _switched_off(PIN_ENV):
            return None
        generation = plan.get("talker").options.get("threads", threads)  # what open_generation gives onnxruntime
        onnx = all(plan.impl(name) == "onnx" for name in ("talker", "predictor"))
        if not onnx or int(generation) not in (1, 2) or _layer_op(plan):
            return None
        one_thread = int(plan.get("vocoder").options.get("threads", threads)) == 1  # as open_vocoder reads it
        return cls(cpus[0], cpus[1], pin_decode=one_thread)

    def worker_affinity(self, threads: int) -> str | None:
        """``session.intra_op_thread_affinities`` of a 2-thread session: its worker on the shared CPU (from 1)."""
        return str(self.shared + 1) if int(threads) == 2 else None

    def claim(self) -> bool:
        """True when the calling stream is placed (no other stream of the process is); then :meth:`release`."""
        with _placed_lock:
            if _PLACED:
                return False
            _PLACED.append(self)
            return True

    def release(self) -> None:
        with _placed_lock:
            _PLACED.clear()

    def pin_generation(self) -> None:
        """The calling thread (a stream's generation thread, which ends with the stream) to its CPU."""
        _pin({self.generation})

    @contextlib.contextmanager
    def decoding(self):
        """The calling thread on the shared CPU while the block runs (a decode), its CPUs after."""
        before = set(os.sched_getaffinity(0)) if self.pin_decode else set()
        if self.shared not in before:  # not pinned, or the caller keeps itself off that CPU
            yield
            return
        _pin({self.shared})
        try:
            yield
        finally:
            _pin(before)


def _layer_op(plan: Plan) -> bool:
    """True when the predictor runs the DecoderLayer op, whose threads would inherit generation's one CPU."""
    try:
        graphs = read_manifest(os.path.dirname(plan.get("predictor").artifacts["main"]))["graphs"]
    except (InputError, KeyError):
        return False
    return any(graphs.get("predictor", {}).get("kernels", {}).values())


def _pin(cpus: set[int]) -> None:
    """The calling thread's CPUs; a refusal (a container that changed its CPU set) is logged, not raised."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        log.debug("placement: CPUs %s refused (%s)", sorted(cpus), exc)
