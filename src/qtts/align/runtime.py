"""Where the aligner comes from and what runs it: snapshot lookup, torch or ONNX (fp32 / int8), the worker.

* :func:`find_aligner` names the snapshot: the one given (a folder or a hub id), else
  ``$QTTS_ALIGNER``, else ``Qwen/Qwen3-ForcedAligner-0.6B`` when it is in the local Hugging Face
  cache (never downloaded on its own); None when there is none (timestamps are then piece-level).
* :func:`open_aligner` loads it on a runtime: ``"torch"`` (the fp32 reference), ``"onnx"`` (fp32
  graph) or ``"onnx-int8"`` (``MatMulNBits`` weights). An ONNX graph is exported once per aligner
  checkpoint into ``$QTTS_CACHE/aligner/`` (the plan cache) and reused.
  The export runs in a child process, like a plan build (:mod:`qtts.plans.build`).
* :class:`AlignerWorker` runs alignments on one thread of its own with few intra-op threads, so a
  pass never runs inside the frame loop and leaves the generation its cores most of the time.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ..errors import InputError, QttsError, require

log = logging.getLogger(__name__)

HUB_ID = "Qwen/Qwen3-ForcedAligner-0.6B"
ENV_ALIGNER = "QTTS_ALIGNER"
#: aligner runtimes: the torch reference, the fp32 ONNX graph, the int8-weight ONNX graph
RUNTIMES = ("torch", "onnx", "onnx-int8")
#: intra-op threads of an aligner pass (the generation keeps the other core)
ALIGNER_THREADS = 1
_BUILD_LOCK = threading.Lock()


def find_aligner(spec: str | None = None) -> str | None:
    """The aligner snapshot folder for ``spec`` (folder or hub id), ``$QTTS_ALIGNER``, or the official
    aligner in the local Hugging Face cache; None when no aligner is given or cached."""
    spec = spec or os.environ.get(ENV_ALIGNER) or None
    if spec:
        from ..weights import resolve_snapshot

        path = resolve_snapshot(spec)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise InputError(f"{spec}: no config.json; pass a Qwen3-ForcedAligner snapshot folder "
                             f"(hf download {HUB_ID} --local-dir DIR)")  # fmt: skip
        return path
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return snapshot_download(HUB_ID, local_files_only=True, cache_dir=os.environ.get("HF_HUB_CACHE") or None)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def plan_runtime(plan) -> tuple[str, str | None]:
    """(runtime, graph file or None) of the aligner for a :class:`qtts.plans.plan.Plan`: its ``aligner``
    entry (impl torch, or onnx with ``precision`` fp32/int8 and an optional ``artifacts.main``), else
    what goes with its talker: torch beside torch, fp32 ONNX beside an fp32 ONNX talker (``faithful``),
    int8 ONNX beside every other ONNX plan (the default)."""
    spec = plan.components.get("aligner") if plan is not None else None
    if spec is not None:
        if spec.impl not in ("torch", "onnx"):
            raise InputError(f"the plan's aligner entry has impl '{spec.impl}'; the aligner runs on torch or onnx")
        if spec.impl == "torch":
            return "torch", None
        return ("onnx" if spec.precision == "fp32" else "onnx-int8"), spec.artifact("main")
    talker = plan.get("talker") if plan is not None else None
    if talker is None or talker.impl == "torch":
        return "torch", None
    return ("onnx" if talker.precision == "fp32" else "onnx-int8"), None


class OnnxAlignerModel:
    """The exported aligner graph behind the torch model's call: ``(input_ids [1, T], mel) -> logits``."""

    def __init__(self, path: str, config, threads: int = ALIGNER_THREADS):
        from ..backends.onnx import open_session

        self.path, self.config = path, config
        self.session = open_session(path, threads)

    def __call__(self, input_ids, mel):
        import torch

        from .aligner import graph_feeds

        return torch.from_numpy(self.session.run(None, graph_feeds(input_ids, mel, self.config))[0])


def aligner_graph(snapshot: str, precision: str, root: str | None = None) -> str:
    """The cached ONNX graph of ``snapshot`` (``precision`` fp32 or int8), exported on first use."""
    from ..plans.cache import cache_root
    from ..plans.plan import fingerprint

    folder = os.path.join(root or cache_root(), "aligner", f"{fingerprint(snapshot)}-{precision}")
    path = os.path.join(folder, "aligner.onnx")
    with _BUILD_LOCK:
        if os.path.isfile(path):
            return path
        log.info("building the %s ONNX aligner of %s in %s (once per aligner checkpoint)", precision, snapshot,
                 folder)  # fmt: skip
        _export(snapshot, precision, folder)
    return path


def _export(snapshot: str, precision: str, folder: str) -> None:
    """Export in a child process (``python -m qtts.export.aligner``: this process never imports the
    exporter or needs its memory) into a temporary folder beside ``folder``, then rename it."""
    from ..plans.cache import export_missing

    missing = export_missing()
    if missing:
        raise InputError(f"building the ONNX aligner needs {missing}: install the export extra "
                         '(pip install -e ".[export]"), or use the torch aligner (a plan entry "aligner": '
                         '{"impl": "torch"}, or --plan torch)')  # fmt: skip
    tmp = folder + f".part-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        cmd = [sys.executable, "-m", "qtts.export.aligner", snapshot, tmp, precision]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise QttsError(f"building the {precision} ONNX aligner of {snapshot} failed: {tail[0]}")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process published the same graph first: use theirs
            if not os.path.isfile(os.path.join(folder, "aligner.onnx")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a rename; a failed or losing build's files


def open_aligner(snapshot: str, runtime: str = "onnx-int8", graph: str | None = None,
                 threads: int = ALIGNER_THREADS):  # fmt: skip
    """A :class:`qtts.align.ForcedAligner` of ``snapshot`` on ``runtime`` (:data:`RUNTIMES`); ``graph``: an
    exported aligner graph to run instead of the cached one."""
    from ..model.aligner_config import AlignerConfig
    from ..text.tokenizer import TextTokenizer
    from .aligner import ForcedAligner

    if runtime not in RUNTIMES:
        raise InputError(f"unknown aligner runtime '{runtime}'; use one of {', '.join(RUNTIMES)}")
    if runtime == "torch":
        require("torch", "torch", "the torch aligner")
        return ForcedAligner.from_dir(snapshot)
    config = AlignerConfig.from_dir(snapshot)
    path = graph or aligner_graph(snapshot, "int8" if runtime == "onnx-int8" else "fp32")
    return ForcedAligner(config, TextTokenizer.from_dir(snapshot), OnnxAlignerModel(path, config, threads),
                         runtime=runtime)  # fmt: skip


#: how much nicer than the generation the aligner's thread runs (Linux: per-thread nice), so that on a
#: busy machine the frames and the audio get the cores first and the word times wait
ALIGNER_NICE = 10


def _lower_priority() -> None:
    """Run this thread ``ALIGNER_NICE`` nicer than it started (Linux threads have their own nice value;
    elsewhere a no-op)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + ALIGNER_NICE))
    except (AttributeError, OSError) as exc:  # no per-thread priority here: the worker runs at normal priority
        log.debug("aligner thread priority unchanged: %s", exc)


class AlignerWorker:
    """One aligner and the thread its passes run on (``submit(fn, *args)`` -> Future), at a lower
    priority than the generation (:data:`ALIGNER_NICE`)."""

    def __init__(self, aligner):
        self.aligner = aligner
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qtts-aligner", initializer=_lower_priority)

    @property
    def runtime(self) -> str:
        return self.aligner.runtime

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


#: loaded aligners by (snapshot, runtime, graph), shared by every TTS of the process (``--max-concurrency``
#: engines, several qtts.load calls): one model in memory and one worker thread; entries are counted
_SHARED: dict[tuple, list] = {}
_SHARED_LOCK = threading.Lock()


def _acquire(key: tuple) -> AlignerWorker:
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            path, runtime, graph = key
            log.info("loading the forced aligner %s (%s)", path, runtime)
            entry = _SHARED[key] = [AlignerWorker(open_aligner(path, runtime, graph)), 0]
        entry[1] += 1
        return entry[0]


def _release(key: tuple) -> None:
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _SHARED[key]
            entry[0].close()


class AlignerSlot:
    """A TTS's aligner: the snapshot found at once (a bad explicit one is an error at load), the model
    loaded on first use (:meth:`get`) on the runtime that goes with the TTS plan, shared with every other
    TTS of the process that uses the same one. An aligner named explicitly that fails to load raises; one
    found on its own (``$QTTS_ALIGNER`` unset, the Hugging Face cache) that fails is logged once, and the
    timings fall back to whole pieces."""

    def __init__(self, spec: str | None, plan=None):
        self.plan = plan
        self.explicit = bool(spec or os.environ.get(ENV_ALIGNER))
        self.path = find_aligner(spec)
        self._key: tuple | None = None
        self._failed = False
        self._lock = threading.Lock()

    def get(self) -> AlignerWorker | None:
        """The loaded aligner's worker, or None without an aligner snapshot (or one that failed to load)."""
        if self.path is None or self._failed:
            return None
        with self._lock:
            key = self._key or (self.path, *plan_runtime(self.plan))
            try:
                worker = _acquire(key) if self._key is None else _SHARED[key][0]
            except (QttsError, InputError, OSError) as exc:
                if self.explicit:
                    raise
                self._failed = True
                log.warning("qtts: the forced aligner %s did not load (%s); word timestamps fall back to whole "
                            "text pieces", self.path, exc)  # fmt: skip
                return None
            self._key = key
            return worker

    def close(self) -> None:
        with self._lock:
            key, self._key = self._key, None
        if key is not None:
            _release(key)
