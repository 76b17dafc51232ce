"""Shared test fixtures (owned by the core engine; keep this API stable). Test modules live in one
folder per concept (tests/text, engine, audio, model, backends, export, parity, server, cli, tools,
api, repo); what they share lives in tests/support/ (the one fake engine: support/fakes.py).

Constants
    ``REPO_ROOT``            the checkout.
    ``REFERENCE_ROOTS``      where the real published files live, all inside the repository:
                             ``tests/data/reference`` (Qwen2 tokenizer, speech-tokenizer config, tensor-name
                             lists; sources in its README.md) and ``src/qtts/data`` (the model configs the
                             package ships). Both have the same layout: ``configs/<name>/...``.
    ``REAL_TOKENIZER_DIR``   ``tests/data/reference/configs/text-tokenizer-qwen2`` (real Qwen2 vocab.json + merges.txt).
    ``reference(*parts)``    -> the path under the first root that has it; fails the test clearly when none does.
    ``reference_configs(name)`` -> ``reference("configs", name)``: a real model's config folder.

Fixtures (session scope; results are cached per argument set)
    The checkpoints and bundles below are built once per test run, not once per xdist worker: the
    first worker that asks builds one under a file lock in the run's shared folder (``run_shared``),
    the other finds it there (or waits for it). They live until the run ends.
    ``run_shared(name, build) -> str``
        The folder ``name`` in the folder every worker of this run shares, made by ``build(path)`` the
        first time any worker asks (``build`` writes ``path``); a build that raised is redone by the
        next caller. Treat the result as read-only.
    ``tiny_snapshot(kind="base", layout="0.6b", seed=0, real_tokenizer=True) -> str``
        Path of a tiny random-weight snapshot in the real layout written by
        :func:`qtts.tools.random_checkpoint.write_random_checkpoint` (fp32). ``kind`` in base /
        custom_voice / voice_design (voice_design needs layout "1.7b"); ``layout`` "0.6b"
        (talker hidden == predictor hidden) or "1.7b" (talker wider: ``small_to_mtp_projection``);
        ``real_tokenizer`` copies the real Qwen2 tokenizer files, else a byte-level stand-in
        ``tokenizer.json`` is written. Treat the directory as read-only.
    ``eos_snapshot(kind="base", layout="0.6b") -> str``
        Like ``tiny_snapshot`` (real tokenizer, seed 0) but written with ``natural_eos=True``: greedy
        generation reaches EOS by itself some frames after the text is used up.
    ``tiny_bundle(kind="custom_voice", *flags) -> str``
        Folder of a ``qtts export onnx`` bundle of ``tiny_snapshot(kind=kind)`` with those CLI flags
        (e.g. ``"--components", "vocoder"``), exported once per run and shared by every module that
        asks for the same ``kind`` and flags (in the same order). Treat it as read-only (copy it to
        change it). A module whose export options no other module uses may still export its own.
    ``mid_snapshot`` -> str
        The mid Base 0.6b checkpoint (every real width, few layers, 2.3 GB; see
        :mod:`qtts.tools.random_checkpoint`), seed 0, real tokenizer: written once per run for the
        batch invariance tests on mid and tests/parity/test_parity_realdims.py.
    ``snapshot``  -> ``tiny_snapshot(kind="custom_voice")``: the default checkpoint of module tests
        (tests/backends/test_qnn.py overrides it with the Base one).
    ``one_thread`` (module scope)
        torch at one intra-op thread for the module, restored after it: tiny models and small
        per-step tensors lose more to thread hand-offs than they gain on the 2-core CI machine.
        Request it as an argument, or for a whole module ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    ``official_tts(path) -> qwen_tts.Qwen3TTSModel``
        The official model loaded from ``path`` with ``dtype=torch.float32`` (cached per path).
        The underlying ``Qwen3TTSForConditionalGeneration`` is ``.model``, its speech tokenizer
        ``.model.speech_tokenizer``. Treat it as read-only (shared by every test).

Environment (set at import, so subprocesses the tests start inherit it)
    ``QTTS_CACHE``  a fresh temporary folder per session: no test reads or writes ``~/.cache/qtts``.
    ``QTTS_PLAN=torch`` unless already set: a load with no plan runs the torch fp32 reference, which
        is what the tests that load a tiny checkpoint without a plan compare against (parity, codes,
        audio). The tests of the automatic plan (``tests/backends/test_plan_cache.py``) unset it.

Markers
    ``@pytest.mark.slow`` tests (full-size checks, minutes and GBs of RAM) are deselected unless the
    ``-m`` expression names ``slow`` (e.g. ``pytest -m slow`` or ``-m "parity or slow"``); CI runs the rest.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import shutil
import tempfile

import pytest

from support.http_clients import share_default_context

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_ROOTS = (os.path.join(REPO_ROOT, "tests", "data", "reference"), os.path.join(REPO_ROOT, "src", "qtts", "data"))
REAL_TOKENIZER_DIR = os.path.join(REFERENCE_ROOTS[0], "configs", "text-tokenizer-qwen2")

_CACHE = tempfile.mkdtemp(prefix="qtts-test-cache-")
atexit.register(shutil.rmtree, _CACHE, True)
os.environ["QTTS_CACHE"] = _CACHE
os.environ.setdefault("QTTS_PLAN", "torch")
share_default_context()  # httpx: one CA bundle load per process, not one per client (support/http_clients.py)


#: The modules that take longest (each 40-170 s of one worker's time under CI's two workers), longest
#: and first-needed first: collected first, so that xdist (``--dist loadfile --no-loadscope-reorder``
#: in scripts/test.sh hands out modules in collection order) starts them first rather than leaving one
#: for the end while the other worker is idle. The mid batch invariance module that writes the shared
#: mid checkpoint comes before the others that read it. The other modules follow, most tests first.
LONGEST_FIRST = (
    "engine/test_batch_invariance_mid_int.py",
    "backends/test_executorch.py",
    "engine/test_batch_invariance_mid_fp32.py",
    "parity/test_parity_realdims.py",
    "export/test_repair.py",
    "backends/test_onnx_engine.py",
    "backends/test_plan_cache.py",
    "server/test_batch_invariance_http.py",
    "server/test_ray_serve.py",
    "engine/test_batching.py",
    "backends/test_qnn.py",
    "api/test_timestamps.py",
    "parity/test_parity_generate.py",
    "repo/test_architecture.py",
    "text/test_prompt.py",
)


def _order_modules(items) -> None:
    """``LONGEST_FIRST``, then the other modules most tests first (xdist's own order); stable: a
    module's tests keep their order."""
    path = {id(item): item.nodeid.split("::")[0].removeprefix("tests/") for item in items}
    count: dict[str, int] = {}
    for p in path.values():
        count[p] = count.get(p, 0) + 1

    def key(item) -> tuple:
        p = path[id(item)]
        return (LONGEST_FIRST.index(p), 0) if p in LONGEST_FIRST else (len(LONGEST_FIRST), -count[p])

    items.sort(key=key)


def pytest_collection_modifyitems(config, items):
    _order_modules(items)
    if "slow" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("slow") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def reference(*parts: str) -> str:
    """A vendored real file or folder (``REFERENCE_ROOTS``); fails (never skips) when it is missing."""
    for root in REFERENCE_ROOTS:
        path = os.path.join(root, *parts)
        if os.path.exists(path):
            return path
    pytest.fail(f"{os.path.join(*parts)} is in none of {REFERENCE_ROOTS}: the vendored reference files "
                "are part of the repository (tests/data/reference/README.md); restore them from git")


def reference_configs(name: str) -> str:
    """The config folder of a real checkpoint (``Qwen3-TTS-12Hz-0.6B-Base``, ...)."""
    return reference("configs", name)


SHARED = "shared"  # the folder, in the run's base temp, that run_shared builds in


def _run_folder(config) -> str:
    """The base temp of the whole run: an xdist worker's own base temp is a folder inside it."""
    base = config._tmp_path_factory.getbasetemp()
    return str(base.parent if hasattr(config, "workerinput") else base)


def build_once(path: str, build) -> str:
    """``build(path)`` unless a process of this run already built ``path``; returns ``path``.

    A file lock beside it makes the other workers wait for the first build rather than repeat it;
    ``path + ".done"`` marks a finished build (a build that raised leaves none and is redone)."""
    done = path + ".done"
    if not os.path.exists(done):
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not os.path.exists(done):
                shutil.rmtree(path, ignore_errors=True)
                build(path)
                open(done, "w").close()
    return path


@pytest.fixture(scope="session")
def run_shared(pytestconfig):
    root = os.path.join(_run_folder(pytestconfig), SHARED)
    os.makedirs(root, exist_ok=True)
    return lambda name, build: build_once(os.path.join(root, name), build)


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or the only process): after every worker
        shutil.rmtree(os.path.join(_run_folder(session.config), SHARED), ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_snapshot(run_shared):
    from qtts.tools.random_checkpoint import write_random_checkpoint

    cache: dict[tuple, str] = {}

    def make(kind: str = "base", layout: str = "0.6b", seed: int = 0, real_tokenizer: bool = True) -> str:
        key = (kind, layout, int(seed), bool(real_tokenizer))
        if key not in cache:
            tok = reference("configs", "text-tokenizer-qwen2") if real_tokenizer else None
            name = f"tiny-{kind}-{layout}-s{seed}-{'real' if real_tokenizer else 'standin'}"
            cache[key] = run_shared(name, lambda out: write_random_checkpoint(
                out, size="tiny", kind=kind, layout=layout, seed=seed, tokenizer_dir=tok))  # fmt: skip
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_bundle(tiny_snapshot, run_shared):
    from qtts.cli import main

    cache: dict[tuple, str] = {}

    def make(kind: str = "custom_voice", *flags: str) -> str:
        key = (kind, tuple(str(f) for f in flags))
        if key not in cache:

            def export(out: str) -> None:
                assert main(["export", "onnx", "-m", tiny_snapshot(kind=kind), "-o", out, *key[1]]) == 0

            digest = hashlib.sha256("\0".join(key[1]).encode()).hexdigest()[:12]
            cache[key] = run_shared(f"bundle-{kind}-{digest}", export)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def mid_snapshot(run_shared):
    from qtts.tools.random_checkpoint import write_random_checkpoint

    tok = reference("configs", "text-tokenizer-qwen2")
    return run_shared("mid-base-0.6b", lambda out: write_random_checkpoint(out, size="mid", kind="base",
                                                                           tokenizer_dir=tok))  # fmt: skip


@pytest.fixture(scope="session")
def tiny_default_cache(tiny_snapshot, run_shared):
    """A ``QTTS_CACHE`` root holding the tiny CustomVoice checkpoint's default plan, built once per run
    the way a user's first load builds it: ``qtts.load`` with no plan (its build child, the real
    exporter). Shared by the run's workers: copy it (:func:`copy_cache`) before using it."""

    def build(out: str) -> None:
        import qtts

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QTTS_CACHE", out)
            for name in ("QTTS_PLAN", "QTTS_TEST_EXPORTER", "QTTS_NO_BUILD"):
                mp.delenv(name, raising=False)
            qtts.load(tiny_snapshot(kind="custom_voice"), threads=1).close()

    return run_shared("cache-default-tiny-custom_voice", build)


def copy_cache(seed: str, root: str) -> str:
    """A private copy of a shared cache root (the plans only: kernels are built per root)."""
    shutil.copytree(os.path.join(seed, "bundles"), os.path.join(root, "bundles"))
    return root


@pytest.fixture(scope="session")
def snapshot(tiny_snapshot):
    """The tiny CustomVoice snapshot (real tokenizer, seed 0): the default checkpoint of module tests."""
    return tiny_snapshot(kind="custom_voice")


@pytest.fixture(scope="module")
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def real_tts(tiny_snapshot):
    """``qtts.load`` of the tiny Base checkpoint on one thread (torch pinned to one thread too)."""
    import torch

    import qtts

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield qtts.load(tiny_snapshot(), threads=1)
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def official_tts():
    import torch

    from support import official

    cache: dict[str, object] = {}

    def load(path: str):
        path = os.path.abspath(str(path))
        if path not in cache:
            qwen_tts = official.qwen_tts()
            cache[path] = qwen_tts.Qwen3TTSModel.from_pretrained(path, dtype=torch.float32)
        return cache[path]

    return load


@pytest.fixture(scope="session")
def eos_snapshot(run_shared):
    """``eos_snapshot(kind="base", layout="0.6b") -> str``: a tiny snapshot written with
    ``natural_eos=True`` (greedy generation reaches EOS by itself some frames after the text is
    used up; see :func:`qtts.tools.random_weights.eos_clock_edits`). Real tokenizer, seed 0, fp32."""
    from qtts.tools.random_checkpoint import write_random_checkpoint

    cache: dict[tuple, str] = {}

    def make(kind: str = "base", layout: str = "0.6b") -> str:
        if (kind, layout) not in cache:
            cache[(kind, layout)] = run_shared(f"eos-{kind}-{layout}", lambda out: write_random_checkpoint(
                out, size="tiny", kind=kind, layout=layout, seed=0,
                tokenizer_dir=reference("configs", "text-tokenizer-qwen2"), natural_eos=True,
            ))  # fmt: skip
        return cache[(kind, layout)]

    return make
