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
        (e.g. ``"--components", "vocoder"``), exported once per session (per xdist worker) and shared
        by every module that asks for the same ``kind`` and flags. Treat it as read-only (copy it to
        change it). A module whose export options no other module uses may still export its own.
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
import os
import shutil
import tempfile

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_ROOTS = (os.path.join(REPO_ROOT, "tests", "data", "reference"), os.path.join(REPO_ROOT, "src", "qtts", "data"))
REAL_TOKENIZER_DIR = os.path.join(REFERENCE_ROOTS[0], "configs", "text-tokenizer-qwen2")

_CACHE = tempfile.mkdtemp(prefix="qtts-test-cache-")
atexit.register(shutil.rmtree, _CACHE, True)
os.environ["QTTS_CACHE"] = _CACHE
os.environ.setdefault("QTTS_PLAN", "torch")


def pytest_collection_modifyitems(config, items):
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


@pytest.fixture(scope="session")
def tiny_snapshot(tmp_path_factory):
    from qtts.tools.random_checkpoint import write_random_checkpoint

    cache: dict[tuple, str] = {}
    root = tmp_path_factory.mktemp("tiny-snapshots")

    def make(kind: str = "base", layout: str = "0.6b", seed: int = 0, real_tokenizer: bool = True) -> str:
        key = (kind, layout, int(seed), bool(real_tokenizer))
        if key not in cache:
            tok = reference("configs", "text-tokenizer-qwen2") if real_tokenizer else None
            out = root / f"{kind}-{layout}-s{seed}-{'real' if real_tokenizer else 'standin'}"
            cache[key] = write_random_checkpoint(
                str(out), size="tiny", kind=kind, layout=layout, seed=seed, tokenizer_dir=tok
            )
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_bundle(tiny_snapshot, tmp_path_factory):
    from qtts.cli import main

    cache: dict[tuple, str] = {}
    root = tmp_path_factory.mktemp("tiny-bundles")

    def make(kind: str = "custom_voice", *flags: str) -> str:
        key = (kind, tuple(str(f) for f in flags))
        if key not in cache:
            out = str(root / f"{kind}-{len(cache)}")
            assert main(["export", "onnx", "-m", tiny_snapshot(kind=kind), "-o", out, *key[1]]) == 0
            cache[key] = out
        return cache[key]

    return make


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
def eos_snapshot(tmp_path_factory):
    """``eos_snapshot(kind="base", layout="0.6b") -> str``: a tiny snapshot written with
    ``natural_eos=True`` (greedy generation reaches EOS by itself some frames after the text is
    used up; see :func:`qtts.tools.random_weights.eos_clock_edits`). Real tokenizer, seed 0, fp32."""
    from qtts.tools.random_checkpoint import write_random_checkpoint

    cache: dict[tuple, str] = {}
    root = tmp_path_factory.mktemp("eos-snapshots")

    def make(kind: str = "base", layout: str = "0.6b") -> str:
        if (kind, layout) not in cache:
            cache[(kind, layout)] = write_random_checkpoint(
                str(root / f"{kind}-{layout}"), size="tiny", kind=kind, layout=layout, seed=0,
                tokenizer_dir=reference("configs", "text-tokenizer-qwen2"), natural_eos=True,
            )
        return cache[(kind, layout)]

    return make
