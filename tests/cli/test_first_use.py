"""What a newcomer hits first, each once reproduced as a traceback or a crash (issue 21): now one
line on stderr with the fix, exit 2 for what the user fixes (bad input, a missing extra), 1 for a
runtime failure, never a traceback and never 134.

A core-only install is simulated by making ``import torch`` fail (``sys.modules['torch'] = None``,
as tests/backends/test_no_torch_runtime.py does). A full disk is simulated with ``RLIMIT_FSIZE``: every
write past the limit fails in the kernel (``EFBIG``; Python ignores ``SIGXFSZ``), in Python's,
libsndfile's, numpy's and the tokenizers' writers alike, the same path as ``ENOSPC``. Before the
fix, ``qtts say`` under it died with ``terminate called without an active exception`` (134): the
generation thread was still running at interpreter exit.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import soundfile as sf

from conftest import REPO_ROOT
from qtts.cli import build_parser, main
from qtts.errors import QttsError

REPO_SRC = os.path.join(REPO_ROOT, "src")
NO_TORCH = ("import sys; sys.modules['torch'] = None; "  # any 'import torch' now raises ImportError
            "from qtts.cli import main; sys.exit(main(sys.argv[1:]))")


def _qtts(argv: list[str], code: str | None = None, file_limit: int | None = None, timeout: float = 300):
    """``python -m qtts ARGV`` (or ``python -c CODE ARGV``) in a subprocess; optional write limit."""
    env = dict(os.environ, PYTHONPATH=REPO_SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "qtts"]
    return subprocess.run(cmd + argv, capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=limit if file_limit else None)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "terminate called" not in err, err[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def ref_wav(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ref") / "me.wav"
    t = np.arange(48000) / 24000
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 160 * t)).astype(np.float32), 24000)
    return str(path)


# -- core-only install -----------------------------------------------------------------------
@pytest.mark.parametrize("command,extra", [("say", "torch"), ("demo", "torch"), ("export", "export"),
                                           ("random-checkpoint", "torch")])
def test_core_only_install_gives_the_install_command(tiny_snapshot, ref_wav, tmp_path, command, extra):
    argv = {"say": ["say", "Hello.", "-m", tiny_snapshot(), "--ref-audio", ref_wav, "-o", str(tmp_path / "o.wav")],
            "demo": ["demo", "-o", str(tmp_path / "d.wav")],
            "export": ["export", "onnx", "-m", tiny_snapshot(kind="custom_voice"), "-o", str(tmp_path / "b")],
            "random-checkpoint": ["random-checkpoint", str(tmp_path / "rc")]}[command]
    proc = _qtts(argv, code=NO_TORCH)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_line(proc.stderr)
    assert line.startswith("qtts: error: ") and f'pip install -e ".[{extra}]"' in line, line
    assert "qtts[" not in line and os.listdir(tmp_path) == [] and proc.stdout == ""
    assert ("--plan BUNDLE/plan.json" in line) == (command == "say")  # say can run a torch-free bundle


def test_install_hints_name_the_checkout_not_pypi():
    from qtts.errors import MissingDependencyError, require

    with pytest.raises(MissingDependencyError) as info:
        require("qtts_no_such_module", "serve", "the HTTP server")
    assert 'pip install -e ".[serve]"' in str(info.value) and "qtts[" not in str(info.value)
    for root, _, files in os.walk(os.path.join(REPO_SRC, "qtts")):
        for name in files:
            if name.endswith((".py", ".sh", ".js", ".html")):
                with open(os.path.join(root, name), encoding="utf-8") as fh:
                    assert "install 'qtts[" not in fh.read(), name


# -- a full disk -----------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", ["wav", "flac"])
def test_say_on_a_full_disk_is_one_line_exit_1(tiny_snapshot, tmp_path, suffix):
    out = tmp_path / f"x.{suffix}"
    argv = ["say", "A sentence long enough to need more room than the disk has.", "-m",
            tiny_snapshot(kind="custom_voice"), "--speaker", "vivian", "--max-frames", "120", "--threads", "1",
            "-q", "-o", str(out)]
    proc = _qtts(argv, file_limit=60_000)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])  # was 134 (SIGABRT)
    line = _one_line(proc.stderr)
    assert line.startswith("qtts: failed: ") and str(out) in line, line
    assert os.listdir(tmp_path) == []  # no partial file, no temporary file


def test_a_failed_write_stops_the_generation_threads(real_tts, tmp_path):
    """In-process: the error leaves write_chunks only after the stream is closed (the generation
    thread joined), even while something still holds the traceback."""
    from qtts.cli.common import Progress
    from qtts.cli.say import write_chunks
    from qtts.options import SynthesisOptions

    tone = 0.3 * np.sin(2 * np.pi * 150 * np.arange(24000) / 24000)
    voice = real_tts.create_voice((tone.astype(np.float32), 24000))
    chunks = real_tts.stream("A long sentence for the failing disk.", voice=voice,
                             options=SynthesisOptions(max_frames=200, seed=1, pipeline=True))
    before = {t for t in threading.enumerate() if t.name == "qtts-generation"}
    out = tmp_path / "x.wav"
    calls = []

    import qtts.audio.writers as writers_mod

    original = writers_mod.AudioWriter.write

    def failing(self, samples):
        calls.append(len(samples))
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, samples)

    writers_mod.AudioWriter.write = failing
    try:
        with pytest.raises(OSError) as info:
            write_chunks(chunks, str(out), "wav", Progress(quiet=True))
    finally:
        writers_mod.AudioWriter.write = original
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert {t for t in threading.enumerate() if t.name == "qtts-generation" and t.is_alive()} <= before
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["random-checkpoint", "export"])
def test_writers_of_folders_on_a_full_disk(tiny_snapshot, tmp_path, command):
    out = tmp_path / "out"
    argv = (["random-checkpoint", str(out)] if command == "random-checkpoint" else
            ["export", "onnx", "-m", tiny_snapshot(kind="custom_voice"), "-o", str(out)])
    proc = _qtts(argv, file_limit=200_000)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    line = _one_line(proc.stderr)
    assert line.startswith("qtts: failed: ") and str(out) in line, line  # File too large (the file, or -o)
    assert not out.exists() and [p for p in os.listdir(tmp_path) if not p.startswith(".")] == []


def test_disk_full_message_names_the_fix():
    from qtts.cli.main import os_error_message

    msg = os_error_message(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/out.wav"))
    assert msg == "No space left on device (/data/out.wav); free some space there or write to another disk"


# -- bad input refused before any work -------------------------------------------------------
def test_plan_that_is_not_text(tiny_snapshot, ref_wav, tmp_path, capsys):
    rc = main(["say", "Hi.", "-m", tiny_snapshot(kind="custom_voice"), "--speaker", "vivian", "--plan", ref_wav,
               "-o", str(tmp_path / "x.wav")])
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert "not a plan file (not UTF-8 text)" in line and ref_wav in line
    assert os.listdir(tmp_path) == []


def test_text_over_the_per_call_limit_is_refused_before_loading(tmp_path, capsys):
    """50,000 characters per call: checked before the model loads (the model 'M' does not exist)."""
    from qtts.text.prompt import MAX_TEXT_CHARS

    assert MAX_TEXT_CHARS == 50_000
    assert main(["say", "a" * 50_001, "-m", str(tmp_path), "--speaker", "vivian", "-o", str(tmp_path / "x.wav")]) == 2
    assert "has 50001 characters; the limit is 50000 per call" in _one_line(capsys.readouterr().err)
    from qtts.errors import InputError
    from qtts.server import ServerSettings

    with pytest.raises(InputError, match="max_input_chars=60000: must be <= 50000"):
        ServerSettings(max_input_chars=60_000)


def test_random_checkpoint_says_what_the_stand_in_tokenizer_does(tmp_path, capsys):
    assert main(["random-checkpoint", str(tmp_path / "rc")]) == 0
    out = capsys.readouterr().out
    assert "stand-in tokenizer" in out and "216 frames" in out and "--max-frames" in out


def test_demo_refuses_empty_text_before_building(tmp_path, capsys):
    assert main(["demo", "--text", "  ", "-o", str(tmp_path / "d.wav")]) == 2
    out, err = capsys.readouterr()
    assert "--text is empty" in _one_line(err) and "checkpoint" not in out and os.listdir(tmp_path) == []


def test_demo_help_documents_seed():
    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    seed = next(a for a in demo._actions if "--seed" in a.option_strings)
    assert seed.help and "same seed" in seed.help


def test_voice_create_wants_a_voice_name_and_keeps_an_existing_file(real_tts, tiny_snapshot, ref_wav, tmp_path,
                                                                     capsys):
    snap = tiny_snapshot()
    assert main(["voice", "create", ref_wav, "-m", snap, "-o", str(tmp_path / "b.wav")]) == 2
    assert "give a path ending in .voice" in _one_line(capsys.readouterr().err)
    old = tmp_path / "me.voice"
    old.write_bytes(b"my earlier voice")
    assert main(["voice", "create", ref_wav, "-m", snap, "-o", str(old)]) == 2
    assert "exists; choose another name or pass --force" in _one_line(capsys.readouterr().err)
    assert old.read_bytes() == b"my earlier voice" and sorted(os.listdir(tmp_path)) == ["me.voice"]
    assert main(["voice", "create", ref_wav, "-m", snap, "--threads", "1", "-o", str(old), "--force"]) == 0
    assert old.read_bytes() != b"my earlier voice"


def test_decode_of_an_audio_file(ref_wav, tmp_path, capsys):
    assert main(["decode", ref_wav, "-m", "M", "-o", str(tmp_path / "x.wav")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "it is WAV audio, not codes" in line and "pickle" not in line


# -- services ----------------------------------------------------------------------------------
def test_wyoming_on_a_port_in_use(tiny_snapshot):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _qtts(["wyoming", "-m", tiny_snapshot(kind="custom_voice"), "--uri", f"tcp://127.0.0.1:{port}"],
                     timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _one_line(proc.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "choose another port" in line


def test_wyoming_port_check_passes_a_free_port():
    from qtts.cli.wyoming import check_port_free

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    check_port_free(f"tcp://127.0.0.1:{port}")  # free again: no error
    check_port_free("stdio://")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(QttsError, match="cannot listen"):
            check_port_free(f"tcp://127.0.0.1:{busy.getsockname()[1]}")


@pytest.mark.parametrize("model,words", [("/nonexistent/model", "no such snapshot directory"),
                                         ("{empty}", "config.json: file not found"),
                                         ("{snapshot}", "plan file not found")])
def test_serve_refuses_a_model_that_cannot_load_before_serving(tiny_snapshot, tmp_path, model, words):
    (tmp_path / "empty").mkdir()
    model = model.replace("{empty}", str(tmp_path / "empty")).replace("{snapshot}", tiny_snapshot(kind="custom_voice"))
    plan = ["--plan", str(tmp_path / "missing.json")] if words.startswith("plan") else []
    proc = _qtts(["serve", "--model", model, "--port", "0", *plan], timeout=60)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert words in _one_line(proc.stderr) and "serving on" not in proc.stdout


def test_serve_ready_line_is_info_in_the_log_and_printed(tiny_snapshot, caplog, capsys, monkeypatch):
    """The ready line is INFO (not WARNING) in the log; the user sees it on stdout beside
    "serving on" (the CLI's root logger shows WARNING and up without -v). Each engine is warmed
    (TTS.warm: the vocoder's packing) before the server reports ready."""
    from qtts.api import TTS
    from qtts.cli.serve import _load_engines
    from qtts.server.app import ServerState
    from qtts.server.settings import ServerSettings

    warmed = []
    monkeypatch.setattr(TTS, "warm", lambda self: warmed.append(state.ready))
    args = build_parser().parse_args(["serve", "-m", tiny_snapshot(kind="custom_voice"), "--threads", "1",
                                      "--max-concurrency", "2"])  # fmt: skip
    state = ServerState(ServerSettings())
    with caplog.at_level(logging.INFO, logger="qtts.cli.serve"):
        _load_engines(args, state)
    assert state.ready and warmed == [False, False]
    ready = [r for r in caplog.records if "ready" in r.getMessage()]
    assert [r.levelno for r in ready] == [logging.INFO]
    out = capsys.readouterr().out
    assert "loaded (2 engine(s)); ready (plan torch fp32 reference)" in out  # QTTS_PLAN=torch (conftest)
    state.shutdown()


def test_rknn_setup_installs_the_toolkit_last_without_its_dependencies():
    """pip (and uv) complain after any install once the toolkit's declared (and deliberately unmet)
    requirements are in the venv; installed last with --no-deps, they never do."""
    path = os.path.join(os.path.dirname(REPO_SRC), "scripts", "setup_rknn_env.sh")
    with open(path, encoding="utf-8") as fh:
        installs = [line for line in fh.read().splitlines() if line.startswith("pyinstall ")]
    assert len(installs) >= 3, "setup_rknn_env.sh installs through pyinstall (scripts/pyinstall.sh)"
    assert "rknn-toolkit2" in installs[-1] and "--no-deps" in installs[-1]
    assert all("rknn-toolkit2" not in line for line in installs[:-1])
