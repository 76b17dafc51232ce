"""Fast by default (qtts.backends.cache): a load with no plan builds the default preset's ONNX bundle
once, caches it per checkpoint / preset / qtts version, and later loads find it.

One real build of the tiny CustomVoice checkpoint (module fixture ``built``) serves every test; the
lock, kill and read-only tests replace the exporter by one that copies that bundle (``FAKE``), so
they test the cache's bookkeeping, not the exporter again."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import qtts
from qtts.backends import cache
from qtts.cli import main as qtts_main
from qtts.errors import InputError

#: a stand-in exporter for subprocesses: logs its pid to COUNT, waits DELAY s, copies SOURCE
FAKE = """
import os, shutil, sys, time
import qtts.export.onnx as onnx_export
count, source, delay = os.environ["FAKE_COUNT"], os.environ["FAKE_SOURCE"], float(os.environ["FAKE_DELAY"])
def fake_export(model, out, opts, overwrite=False, progress=None):
    with open(count, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    os.makedirs(out)
    open(os.path.join(out, "partial.onnx"), "w").close()
    time.sleep(delay)
    shutil.rmtree(out)
    shutil.copytree(source, out)
onnx_export.export_bundle = fake_export
from qtts.backends.cache import resolve_plan
print(resolve_plan(None, sys.argv[1]), flush=True)
"""
BLOCK_TORCH = (
    "import sys; sys.modules['torch'] = None; "
    "from qtts.cli import main; rc = main(sys.argv[1:]); "
    "assert sys.modules['torch'] is None; sys.exit(rc)"
)


@pytest.fixture(scope="module")
def built(tiny_snapshot, tmp_path_factory):
    """(snapshot, cache root, plan.json): the default plan of the tiny CustomVoice checkpoint, built by a load."""
    snapshot = tiny_snapshot(kind="custom_voice")
    root = str(tmp_path_factory.mktemp("plan-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QTTS_CACHE", root)
        mp.delenv("QTTS_PLAN", raising=False)
        tts = qtts.load(snapshot, threads=1)
        plan = tts.components.plan
        assert plan.get("talker").impl == "onnx" and plan.get("talker").precision == "int8"
        assert plan.path.startswith(os.path.join(root, "bundles"))
    return snapshot, root, plan.path


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """No QTTS_PLAN, an empty cache of this test's own; returns the cache root."""
    root = str(tmp_path / "cache")
    monkeypatch.setenv("QTTS_CACHE", root)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    monkeypatch.delenv("QTTS_NO_BUILD", raising=False)
    return root


def _fake_env(tmp_path, source: str, delay: float) -> dict:
    env = dict(os.environ, FAKE_COUNT=str(tmp_path / "builds.txt"), FAKE_SOURCE=os.path.dirname(source),
               FAKE_DELAY=str(delay))  # fmt: skip
    env.pop("QTTS_PLAN", None)
    return env


def _copy_exporter(monkeypatch, source: str, calls: list) -> None:
    import qtts.export.onnx as onnx_export

    def fake_export(model, out, opts, overwrite=False, progress=None):
        calls.append(opts)
        shutil.copytree(os.path.dirname(source), out)

    monkeypatch.setattr(onnx_export, "export_bundle", fake_export)


def test_hit_after_miss_loads_the_cached_bundle_without_export(built, monkeypatch):
    snapshot, root, path = built
    monkeypatch.setenv("QTTS_CACHE", root)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    calls = []
    _copy_exporter(monkeypatch, path, calls)
    tts = qtts.load(snapshot, threads=1)
    assert tts.components.plan.path == path and calls == []
    assert cache.plan_label(tts.components.plan).startswith("fast (onnx: talker int8, predictor int8")
    audio = tts.synthesize("Hello there.", speaker="serena", options=qtts.SynthesisOptions(seed=1, max_frames=4))
    assert 0 < len(audio.samples) <= 4 * 1920
    assert len(os.listdir(os.path.join(root, "bundles"))) == 1


def test_plan_torch_is_still_the_reference(built, monkeypatch):
    snapshot, root, _ = built
    monkeypatch.setenv("QTTS_CACHE", root)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    tts = qtts.load(snapshot, plan="torch", threads=1)
    assert all(tts.components.plan.get(n).impl == "torch" for n in ("talker", "predictor", "vocoder"))
    assert type(tts.components.backend).__name__ == "TorchBackend"
    assert cache.plan_label(tts.components.plan) == "torch fp32 reference"


def test_key_differs_by_checkpoint_preset_and_qtts_version(built, tiny_snapshot, monkeypatch):
    snapshot, root, path = built
    monkeypatch.setenv("QTTS_CACHE", root)
    assert cache.find_bundle(snapshot, "fast") == path
    assert cache.find_bundle(tiny_snapshot(kind="custom_voice", seed=1), "fast") is None  # another checkpoint
    assert cache.find_bundle(snapshot, "fastest") is None
    monkeypatch.setattr(qtts, "__version__", "99.0.0")
    assert cache.find_bundle(snapshot, "fast") is None
    monkeypatch.setattr(cache, "runtime_version", lambda: "0.0.1")
    assert cache.find_bundle(snapshot, "fast") is None


def test_no_build_names_the_command(tiny_snapshot, auto, tmp_path, capsys, monkeypatch):
    snapshot = tiny_snapshot(kind="custom_voice")
    rc = qtts_main(["say", "Hi.", "-m", snapshot, "--speaker", "serena", "-o", str(tmp_path / "a.wav"), "--no-build"])
    err = capsys.readouterr().err
    assert rc == 2 and f"qtts cache build -m {snapshot} --plan fast" in err and "Traceback" not in err
    monkeypatch.setenv("QTTS_NO_BUILD", "1")
    with pytest.raises(InputError, match="building is off"):
        qtts.load(snapshot)
    assert not os.path.exists(tmp_path / "a.wav")


def test_unwritable_cache_builds_in_a_temporary_folder(built, tmp_path, monkeypatch, caplog):
    snapshot, _, path = built
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("QTTS_CACHE", str(blocker / "cache"))
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    calls = []
    _copy_exporter(monkeypatch, path, calls)
    with caplog.at_level(logging.WARNING, logger="qtts"):
        tts = qtts.load(snapshot, threads=1)
    warnings = [r.getMessage() for r in caplog.records if "not writable" in r.getMessage()]
    assert len(warnings) == 1 and "temporary folder" in warnings[0], caplog.text
    assert len(calls) == 1 and calls[0].talker == "int8" and calls[0].tables == "int8"
    assert tts.components.plan.get("talker").impl == "onnx"
    assert not tts.components.plan.path.startswith(str(blocker))


def test_two_processes_at_once_build_once(built, tmp_path):
    snapshot, _, path = built
    env = _fake_env(tmp_path, path, delay=3.0)
    env["QTTS_CACHE"] = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", FAKE, snapshot], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    plans = {o[0].strip() for o in outs}
    assert len(plans) == 1 and os.path.isfile(plans.pop())
    assert len((tmp_path / "builds.txt").read_text().split()) == 1  # one exporter ran, the other waited


def test_a_killed_build_is_not_reused(built, tmp_path, monkeypatch):
    snapshot, _, path = built
    root = tmp_path / "cache"
    env = _fake_env(tmp_path, path, delay=120.0)
    env["QTTS_CACHE"] = str(root)
    proc = subprocess.Popen([sys.executable, "-c", FAKE, snapshot], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "builds.txt").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert (tmp_path / "builds.txt").exists(), "the build never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    staged = [n for n in os.listdir(root / "bundles") if n.endswith(".part")]
    assert staged, os.listdir(root / "bundles")
    monkeypatch.setenv("QTTS_CACHE", str(root))
    assert cache.find_bundle(snapshot, "fast") is None  # the half-written staging folder is no bundle
    calls = []
    _copy_exporter(monkeypatch, path, calls)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    found = cache.resolve_plan(None, snapshot)  # the lock died with its process: no wait
    assert len(calls) == 1 and found == cache.find_bundle(snapshot, "fast")
    assert not [n for n in os.listdir(root / "bundles") if n.endswith(".part")]


def test_torch_free_install_uses_a_cached_bundle(built, tmp_path):
    snapshot, root, _ = built
    env = {k: v for k, v in os.environ.items() if k != "QTTS_PLAN"}
    wav = str(tmp_path / "out.wav")
    cmd = [sys.executable, "-c", BLOCK_TORCH, "say", "Hello.", "-m", snapshot, "--speaker", "serena",
           "--seed", "1", "--max-frames", "4", "-o", wav]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(env, QTTS_CACHE=root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plan=fast" in proc.stderr and os.path.getsize(wav) > 44
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(env, QTTS_CACHE=str(tmp_path / "empty")))  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'pip install -e ".[export]"' in proc.stderr and "--plan" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cache_ls_and_rm(built, tmp_path, monkeypatch, capsys):
    snapshot, root, _ = built
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    monkeypatch.setenv("QTTS_CACHE", str(copy))
    assert qtts_main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "1 plan(s)" in out and " fast " in out and snapshot in out and " MB " in out
    assert qtts_main(["cache", "rm", "-m", snapshot, "--plan", "fastest"]) == 0  # nothing of that preset
    assert "nothing matched" in capsys.readouterr().out
    assert qtts_main(["cache", "rm", "-m", snapshot]) == 0
    assert "removed" in capsys.readouterr().out
    assert cache.find_bundle(snapshot, "fast") is None


def test_health_names_the_plan_and_the_build(built, monkeypatch):
    import httpx

    from qtts.server import ServerSettings, create_app
    from qtts.server.runner import ServerThread
    from support.server_util import assert_error

    snapshot, root, _ = built
    monkeypatch.setenv("QTTS_CACHE", root)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    app = create_app(None, ServerSettings())
    with ServerThread(app) as srv:
        app.state.qtts.build_listener("the plan")(42, "talker")
        assert_error(httpx.get(srv.url + "/health"), 503, "building the plan, 42 %")
        app.state.qtts.set_engine(qtts.load(snapshot, threads=1))
        health = httpx.get(srv.url + "/health").json()
    assert health["status"] == "ok" and health["model"]["plan"].startswith("fast (onnx: talker int8")


def test_presets_of_one_checkpoint_share_identical_files(built, tmp_path, monkeypatch, capsys):
    from qtts.cli.cache import disk_bytes

    snapshot, root, path = built
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    monkeypatch.setenv("QTTS_CACHE", str(copy))
    calls = []
    _copy_exporter(monkeypatch, path, calls)  # 'fastest' made of the same files: every one is shared
    fastest = cache.resolve_plan("fastest", snapshot)
    fast = cache.find_bundle(snapshot, "fast")
    assert len(calls) == 1 and calls[0].talker == "int4" and os.path.dirname(fastest) != os.path.dirname(fast)
    a, b = (os.path.join(os.path.dirname(p), "vocoder.data") for p in (fast, fastest))
    assert os.stat(a).st_ino == os.stat(b).st_ino
    bundles = [os.path.dirname(fast), os.path.dirname(fastest)]
    assert disk_bytes(bundles) < sum(disk_bytes([d]) for d in bundles)
    assert qtts_main(["cache", "rm", "--plan", "fast"]) == 0
    assert cache.find_bundle(snapshot, "fast") is None and os.path.getsize(b) > 0
    monkeypatch.setenv("QTTS_PLAN", "fastest")
    assert qtts.load(snapshot, threads=1).components.plan.path == fastest
