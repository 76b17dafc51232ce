"""``qtts serve`` end to end: a subprocess that answers 503 while loading, then serves; SIGTERM stops it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from qtts.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("extra", [[], ["--max-batch", "3"], ["--max-batch", "3", "--capacity", "auto"]],
                         ids=["engines", "batched", "capacity-auto"])
def test_serve_subprocess(tiny_snapshot, tmp_path, extra):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "qtts", "serve", "--model", tiny_snapshot(kind="custom_voice"), "--port",
           str(port), "--voices", str(tmp_path / "voices"), "--max-frames", "4", "--threads", "1",
           "--header-timeout", "1.5", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        statuses = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                statuses.append(httpx.get(url + "/health", timeout=5).status_code)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if statuses[-1] == 200:
                break
            time.sleep(0.05)
        assert statuses and statuses[-1] == 200, statuses
        assert set(statuses) <= {200, 503}
        r = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", "voice": "vivian", "response_format": "pcm"},
                       timeout=60)
        assert r.status_code == 200 and len(r.content) == 4 * 3840
        health = httpx.get(url + "/health", timeout=5).json()
        assert health["max_batch"] == (3 if extra else 1)
        if "auto" in extra:  # measured at start-up: between 1 and the batch size, and served as such
            assert 1 <= health["capacity"] <= 3 and health["max_concurrency"] == health["capacity"]
        else:
            assert health["max_concurrency"] == health["capacity"] == (3 if extra else 1)
        # --header-timeout reaches uvicorn: a silent connection gets 408 and is closed
        with socket.create_connection(("127.0.0.1", port), timeout=15) as silent:
            assert silent.recv(4096).startswith(b"HTTP/1.1 408 ")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal (exit by SIGTERM, as a service manager expects)
    assert proc.returncode in (0, -signal.SIGTERM), err[-2000:]
    assert f"serving on http://127.0.0.1:{port}" in out
    assert f"web page: http://127.0.0.1:{port}/" in out
    access = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    speech = [a for a in access if a["route"] == "/v1/audio/speech"]
    assert speech and speech[0]["status"] == 200 and speech[0]["frames"] == 4
    assert os.path.isdir(tmp_path / "voices")


@pytest.mark.parametrize("argv", [["serve", "--model", "m", "--host", "not a host"],
                                  ["serve", "--model", "m", "--max-concurrency", "0"],
                                  ["serve", "--model", "m", "--header-timeout", "0"],
                                  ["serve", "--model", "m", "--body-timeout", "-1"],
                                  ["serve", "--model", "m", "--max-connections", "0"],
                                  ["serve", "--model", "m", "--max-batch", "0"],
                                  ["serve", "--model", "m", "--capacity", "0"],
                                  ["serve", "--model", "m", "--capacity", "many"],
                                  ["serve", "--model", "m", "--max-batch", "2", "--max-concurrency", "2"],
                                  ["serve", "--model", "m", "--ray", "--max-concurrency", "2"],
                                  ["serve", "--model", "m", "--ray", "--autoscale", "many"],
                                  ["serve", "--model", "m", "--voice-alias", "alloy"],
                                  ["serve", "--model", "m", "--voice-alias", "alloy=../x"],
                                  ["serve", "--model", "m", "--default-format", "aac"]])
def test_serve_rejects_bad_flags(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_serve_flags_reach_the_settings(tiny_snapshot):
    """--voice-alias (repeatable, later wins) and --default-format (mp3 unless told)."""
    from qtts.cli import build_parser
    from qtts.cli.serve import _settings

    parse = build_parser().parse_args
    plain = _settings(parse(["serve", "-m", "m"]))
    assert plain.default_response_format == "mp3" and plain.voice_aliases == ()
    args = parse(["serve", "-m", "m", "--default-format", "wav", "--voice-alias", "Alloy=ryan",
                  "--voice-alias", "nova = serena"])
    s = _settings(args)
    assert s.default_response_format == "wav" and s.voice_aliases == (("alloy", "ryan"), ("nova", "serena"))
