"""Fast by default (qtts.plans.cache): a load with no plan builds the default preset's ONNX bundle
once, in a child process, caches it per checkpoint / preset / qtts version, and later loads find it.

One real build of the tiny CustomVoice checkpoint (module fixture ``built``: the real child, the real
exporter) serves every test; the lock, kill, failure and read-only tests run the real child too, with
its test hook ``QTTS_TEST_EXPORTER`` naming tests/support/fake_exporter.py (it copies that bundle,
recording each export in a file), so they test the cache's bookkeeping, not the exporter again."""

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
from conftest import REPO_ROOT, copy_cache
from qtts.cli import main as qtts_main
from qtts.errors import InputError, QttsError
from qtts.plans import cache
from qtts.plans.plan import bf16_vocoder_runs_here
from support.fake_exporter import builds

#: a loading process that builds the default plan and checks it imported no exporter and no torch
LOADER = """
import sys
from qtts.plans.cache import resolve_plan
plan = resolve_plan(None, sys.argv[1])
assert not [m for m in sys.modules if m.startswith("qtts.export")], "the loading process imported qtts.export"
assert "torch" not in sys.modules, "the loading process imported torch"
print(plan, flush=True)
"""
BLOCK_TORCH = (
    "import sys; sys.modules['torch'] = None; "
    "from qtts.cli import main; rc = main(sys.argv[1:]); "
    "assert sys.modules['torch'] is None; sys.exit(rc)"
)


@pytest.fixture(scope="module")
def built(tiny_snapshot, tiny_default_cache, tmp_path_factory):
    """(snapshot, cache root, plan.json): the default plan of the tiny CustomVoice checkpoint, built by a
    load (the real child process and exporter, end to end: conftest's ``tiny_default_cache``), in a
    cache of this module's own that a load here finds."""
    snapshot = tiny_snapshot(kind="custom_voice")
    root = copy_cache(tiny_default_cache, str(tmp_path_factory.mktemp("plan-cache")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QTTS_CACHE", root)
        mp.delenv("QTTS_PLAN", raising=False)
        mp.delenv("QTTS_TEST_EXPORTER", raising=False)
        tts = qtts.load(snapshot, threads=1)
        plan = tts.components.plan
        assert plan.get("talker").impl == "onnx" and plan.get("talker").precision == "int8"
        assert plan.path.startswith(os.path.join(root, "bundles"))
    info = cache.read_info(os.path.dirname(plan.path))
    assert info["preset"] == "fast" and info["build_s"] > 0 and "torch" in info["versions"]
    return snapshot, root, plan.path


def test_the_default_plan_is_rotated_int8_and_keeps_its_fidelity(built):
    """The default preset as built (int8, Hadamard-rotated, int8 tables) against the torch fp32 reference
    on the tiny checkpoint: the default rule's 25 dB on both logit SNRs (one run: talker 38.8, predictor
    34.7 dB min; at full size 31.6 / 30.0 dB, docs/fidelity.md) and the fp32 vocoder's 80 dB."""
    from qtts.export.verify import verify_plan

    snapshot, _root, plan_path = built
    report = verify_plan(snapshot, plan_path, frames=12, threads=1)
    assert report["weights"]["recipe"]["repair"] == ["rotate"], report["weights"]
    assert report["talker_logit_snr_db_min"] >= 25.0, report
    assert report["predictor_logit_snr_db_min"] >= 25.0, report
    # the fp32 vocoder's 80 dB; where the CPU has bf16 the bf16 step runs (its bound: test_vocoder_step_bf16.py)
    assert report["vocoder_snr_db"] >= (28.0 if bf16_vocoder_runs_here() else 80.0), report


def default_label() -> str:
    """How logs and /health name the default plan here: its vocoder is the bf16 step on a bf16 CPU."""
    if bf16_vocoder_runs_here():
        return "fast (talker onnx int8, predictor onnx int8, vocoder torch bf16)"
    return "fast (onnx: talker int8, predictor int8, vocoder fp32)"


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """No QTTS_PLAN, an empty cache of this test's own; returns the cache root."""
    root = str(tmp_path / "cache")
    monkeypatch.setenv("QTTS_CACHE", root)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    monkeypatch.delenv("QTTS_NO_BUILD", raising=False)
    return root


@pytest.fixture
def fake(built, tmp_path, monkeypatch):
    """The build child's exporter replaced by support/fake_exporter.py (in this process's environment,
    so children and their children get it); returns the file that records the exports."""
    _, _, path = built
    count = str(tmp_path / "builds.jsonl")
    tests = os.path.join(REPO_ROOT, "tests")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    monkeypatch.setenv("QTTS_TEST_EXPORTER", "support.fake_exporter")
    monkeypatch.setenv("FAKE_SOURCE", os.path.dirname(path))
    monkeypatch.setenv("FAKE_COUNT", count)
    monkeypatch.setenv("FAKE_DELAY", "0")
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    return count


def _gone(pid: int) -> bool:
    """The process ended (a zombie waiting to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _wait_for_child(count: str, proc, deadline_s: float = 180) -> int:
    """The pid of the build child once its exporter started (bounded wait)."""
    deadline = time.monotonic() + deadline_s
    while not builds(count) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert builds(count), f"the build never started (rc {proc.poll()})"
    return builds(count)[0]["pid"]


def _staged(root) -> list[str]:
    return [n for n in os.listdir(os.path.join(root, "bundles")) if n.endswith(".part")]


def test_hit_after_miss_loads_the_cached_bundle_without_export(built, fake, monkeypatch):
    snapshot, root, path = built
    monkeypatch.setenv("QTTS_CACHE", root)
    tts = qtts.load(snapshot, threads=1)
    assert tts.components.plan.path == path and builds(fake) == []  # no build child ran
    assert cache.plan_label(tts.components.plan).startswith(default_label())
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
    monkeypatch.setattr(qtts.version, "__version__", "99.0.0")
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


def test_unwritable_cache_builds_in_a_temporary_folder(built, fake, tmp_path, monkeypatch, caplog):
    snapshot, _, path = built
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("QTTS_CACHE", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="qtts"):
        tts = qtts.load(snapshot, threads=1)
    warnings = [r.getMessage() for r in caplog.records if "not writable" in r.getMessage()]
    assert len(warnings) == 1 and "temporary folder" in warnings[0], caplog.text
    done = builds(fake)
    assert len(done) == 1 and done[0]["opts"]["talker"] == "int8" and done[0]["opts"]["tables"] == "int8"
    assert done[0]["pid"] != os.getpid()  # exported in the child process
    assert tts.components.plan.get("talker").impl == "onnx"
    assert not tts.components.plan.path.startswith(str(blocker))


def test_the_child_relays_progress_and_logs(built, fake, auto, caplog):
    snapshot = built[0]
    seen = []
    with caplog.at_level(logging.INFO):
        found = cache.resolve_plan(None, snapshot, listeners=(lambda pct, phase: seen.append((pct, phase)),))
    assert found == cache.find_bundle(snapshot, "fast") and len(builds(fake)) == 1
    text = caplog.text
    assert "building the 'fast' plan: " in text and "% (talker)" in text  # the child's phases, shown here
    assert "fake exporter: copying a bundle for" in text  # a log record of the child, logged again here
    assert seen[-1] == (100, "done")
    assert cache.read_info(os.path.dirname(found))["preset"] == "fast"  # the child wrote the cache info


def test_a_failing_export_is_one_clear_error_and_leaves_nothing(built, fake, auto, monkeypatch):
    snapshot = built[0]
    monkeypatch.setenv("FAKE_FAIL", "the exporter ran out of luck")
    with pytest.raises(QttsError, match="building the 'fast' plan failed: the exporter ran out of luck"):
        cache.resolve_plan(None, snapshot)
    assert cache.find_bundle(snapshot, "fast") is None and _staged(auto) == []
    proc = subprocess.run([sys.executable, "-m", "qtts", "cache", "build", "-m", snapshot], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1 and "the exporter ran out of luck" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_two_processes_at_once_build_once_and_import_no_exporter(built, fake, tmp_path, monkeypatch):
    snapshot = built[0]
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_DELAY", "3")
    procs = [subprocess.Popen([sys.executable, "-c", LOADER, snapshot], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    plans = {o[0].strip() for o in outs}
    assert len(plans) == 1 and os.path.isfile(plans.pop())
    assert len(builds(fake)) == 1  # one exporter ran, the other process waited
    assert builds(fake)[0]["pid"] not in [p.pid for p in procs]  # in a child of the builder


def test_a_killed_build_child_is_not_reused(built, fake, auto, monkeypatch):
    """SIGKILL the real build child: its parent fails with one line and leaves nothing behind."""
    snapshot = built[0]
    monkeypatch.setenv("FAKE_DELAY", "120")
    parent = subprocess.Popen([sys.executable, "-m", "qtts", "cache", "build", "-m", snapshot],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    child = _wait_for_child(fake, parent)
    assert child != parent.pid
    os.kill(child, signal.SIGKILL)
    _, err = parent.communicate(timeout=120)
    assert parent.returncode == 1 and "stopped by SIGKILL" in err and "Traceback" not in err, err[-3000:]
    assert cache.find_bundle(snapshot, "fast") is None and _staged(auto) == []
    monkeypatch.setenv("FAKE_DELAY", "0")
    assert cache.resolve_plan(None, snapshot) == cache.find_bundle(snapshot, "fast")
    assert len(builds(fake)) == 2


def test_a_killed_parent_stops_its_child_and_leaves_no_bundle(built, fake, auto, monkeypatch):
    """SIGKILL the loading process mid-build: the child stops too; the staging folder is no bundle and
    the next build removes it (the lock died with its process: no wait)."""
    snapshot = built[0]
    monkeypatch.setenv("FAKE_DELAY", "120")
    parent = subprocess.Popen([sys.executable, "-c", LOADER, snapshot], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    child = _wait_for_child(fake, parent)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 60
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), "the build child outlived its parent"
    assert _staged(auto), os.listdir(os.path.join(auto, "bundles"))
    assert cache.find_bundle(snapshot, "fast") is None  # the half-written staging folder is no bundle
    monkeypatch.setenv("FAKE_DELAY", "0")
    found = cache.resolve_plan(None, snapshot)
    assert len(builds(fake)) == 2 and found == cache.find_bundle(snapshot, "fast")
    assert _staged(auto) == []


def test_torch_free_install_uses_a_cached_bundle(built, tmp_path):
    snapshot, root, _ = built
    env = {k: v for k, v in os.environ.items() if k != "QTTS_PLAN"}
    wav = str(tmp_path / "out.wav")
    cmd = [sys.executable, "-c", BLOCK_TORCH, "say", "Hello.", "-m", snapshot, "--speaker", "serena",
           "--seed", "1", "--max-frames", "4", "--force", "-o", wav]  # fmt: skip
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
    assert health["status"] == "ok" and health["model"]["plan"].startswith(default_label())


def test_presets_of_one_checkpoint_share_identical_files(built, fake, tmp_path, monkeypatch, capsys):
    from qtts.cli.cache import disk_bytes

    snapshot, root, path = built
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    monkeypatch.setenv("QTTS_CACHE", str(copy))
    fastest = cache.resolve_plan("fastest", snapshot)  # 'fastest' made of the same files: every one is shared
    fast = cache.find_bundle(snapshot, "fast")
    done = builds(fake)
    assert len(done) == 1 and done[0]["opts"]["talker"] == "int4"
    assert os.path.dirname(fastest) != os.path.dirname(fast)
    a, b = (os.path.join(os.path.dirname(p), "vocoder.data") for p in (fast, fastest))
    assert os.stat(a).st_ino == os.stat(b).st_ino
    bundles = [os.path.dirname(fast), os.path.dirname(fastest)]
    assert disk_bytes(bundles) < sum(disk_bytes([d]) for d in bundles)
    assert qtts_main(["cache", "rm", "--plan", "fast"]) == 0
    assert cache.find_bundle(snapshot, "fast") is None and os.path.getsize(b) > 0
    monkeypatch.setenv("QTTS_PLAN", "fastest")
    assert qtts.load(snapshot, threads=1).components.plan.path == fastest
