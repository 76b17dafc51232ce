"""The command set of the aarch64 lane (benchmarks/arm.sh), run the same way on both sides, and the
comparison of the two sides' outputs.

    python benchmarks/arm_lane.py run OUT --model CKPT --bundle fp32=B32 --bundle int8=B8 [--timeout S]
    python benchmarks/arm_lane.py compare X86_OUT ARM_OUT [--markdown FILE]

``run`` drives the installed ``qtts`` of this interpreter (on the emulated arm64 root: a core
install, no torch) through: ``qtts kernels build`` / ``status``, per bundle ``qtts say`` to a WAV
with ``--codes-out`` and to stdout, ``qtts decode`` of those codes, a seeded ``qtts say``, the fp32
``say`` with ``QTTS_KERNELS=0`` (the plain vocoder graph), with ``--codes-from`` ``qtts decode`` of
the other side's codes, ``qtts serve`` + one POST
/v1/audio/speech, ``qtts wyoming`` + describe + synthesize. Each command's exit status, wall time
and stderr tail go to ``OUT/results.json``. ``compare`` reads two such folders: codes equal or the
first divergent frame, audio SNR between the sides, and each side's own consistency (stdout PCM
equals the WAV, decode equals say). Only numpy, soundfile and (for the Wyoming client) wyoming.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request

TEXT = "Hello from the arm lane."
SPEAKER = "vivian"
FRAMES = 24
SEED = 7


def _qtts(*args: str) -> list[str]:
    return [sys.executable, "-m", "qtts", *args]


def _record(results: list, name: str, cmd: list[str], proc, start: float, outputs: list[str]) -> None:
    results.append({
        "name": name, "cmd": " ".join(cmd[2:]) if cmd[:2] == [sys.executable, "-m"] else " ".join(cmd),
        "rc": proc.returncode, "seconds": round(time.monotonic() - start, 1),
        "stderr_tail": (proc.stderr or b"").decode(errors="replace").strip().splitlines()[-3:],
        "outputs": {o: os.path.getsize(o) for o in outputs if os.path.exists(o)},
    })
    print(f"[{results[-1]['seconds']:7.1f} s] rc={proc.returncode} {name}", flush=True)


def _step(results, name, cmd, timeout, outputs=(), stdout_to=None, env=None) -> None:
    start = time.monotonic()
    try:
        if stdout_to:
            with open(stdout_to, "wb") as fh:
                proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, timeout=timeout, env=env, check=False)
        else:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(cmd, 124, b"", (exc.stderr or b"") + b"\ntimed out")
    if stdout_to is None and proc.stdout:
        print(proc.stdout.decode(errors="replace").strip(), flush=True)
    _record(results, name, cmd, proc, start, [*outputs, *([stdout_to] if stdout_to else [])])
    results[-1]["stdout"] = (proc.stdout or b"").decode(errors="replace").strip()[-500:] if not stdout_to else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(1.0)
    return False


def _healthy(port: int, proc, timeout: float) -> bool:
    """GET /health until 200 (the server listens before its engine has loaded: 503 until then)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1.0)
    return False


class _Server:
    """A ``qtts`` server child process; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, cmd: list[str], port: int, timeout: float, log: str):
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.up = _wait_port(port, self.proc, timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _serve(results, out, model, plan, timeout) -> None:
    port, wav = _free_port(), os.path.join(out, "serve-fp32.wav")
    cmd = _qtts("serve", "-m", model, "--plan", plan, "--port", str(port), "--max-frames", str(FRAMES), "--no-access-log")
    start = time.monotonic()
    with _Server(cmd, port, timeout, os.path.join(out, "serve.log")) as srv:
        ready = srv.up and _healthy(port, srv.proc, timeout)
        rc, err = (0, "") if ready else (1, "the server did not become healthy")
        if ready:
            body = json.dumps({"model": "qtts", "voice": SPEAKER, "input": TEXT, "response_format": "wav", "seed": SEED})
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp, open(wav, "wb") as fh:
                    fh.write(resp.read())
            except OSError as exc:
                rc, err = 1, f"request failed: {exc}"
    proc = subprocess.CompletedProcess(cmd, rc, b"", err.encode())
    _record(results, "serve + POST /v1/audio/speech (seed 7)", cmd, proc, start, [wav])


async def _wyoming_client(port: int, wav: str) -> dict:
    import wave

    from wyoming.audio import AudioChunk, AudioStart
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info
    from wyoming.tts import Synthesize, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as c:
        await c.write_event(Describe().event())
        while (event := await c.read_event()) is not None and not Info.is_type(event.type):
            pass
        info = Info.from_event(event)
    async with AsyncTcpClient("127.0.0.1", port) as c:
        await c.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name=SPEAKER)).event())
        with wave.open(wav, "wb") as w:
            while (event := await c.read_event()) is not None and event.type != "audio-stop":
                if AudioStart.is_type(event.type):
                    s = AudioStart.from_event(event)
                    w.setframerate(s.rate), w.setsampwidth(s.width), w.setnchannels(s.channels)
                elif AudioChunk.is_type(event.type):
                    w.writeframes(AudioChunk.from_event(event).audio)
                elif event.type == "error":
                    raise RuntimeError(event.data.get("text"))
    (program,) = info.tts
    return {"program": program.name, "voices": [v.name for v in program.voices]}


def _wyoming(results, out, model, plan, timeout) -> None:
    port, wav = _free_port(), os.path.join(out, "wyoming-fp32.wav")
    cmd = _qtts("wyoming", "-m", model, "--plan", plan, "--uri", f"tcp://127.0.0.1:{port}",
                "--seed", str(SEED), "--max-frames", str(FRAMES))
    start = time.monotonic()
    with _Server(cmd, port, timeout, os.path.join(out, "wyoming.log")) as srv:
        rc, err, info = 1, "the service did not listen", {}
        if srv.up:
            try:
                info = asyncio.run(asyncio.wait_for(_wyoming_client(port, wav), timeout))
                rc, err = 0, ""
            except (OSError, RuntimeError, asyncio.TimeoutError, ValueError) as exc:
                err = f"client failed: {exc!r}"
    proc = subprocess.CompletedProcess(cmd, rc, b"", err.encode())
    _record(results, "wyoming describe + synthesize (seed 7)", cmd, proc, start, [wav])
    results[-1]["describe"] = info


def run(args) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "QTTS_CACHE": os.path.join(out, "cache")}
    os.environ.update(env)
    results: list = []
    t = args.timeout
    _step(results, "kernels build", _qtts("kernels", "build", "--force"), t)
    _step(results, "kernels status", _qtts("kernels", "status"), t)
    say = ("say", TEXT, "-m", args.model, "--speaker", SPEAKER, "--max-frames", str(FRAMES), "--force")  # OUT may be reused
    for prec, bundle in (b.split("=", 1) for b in args.bundle):
        plan = os.path.join(bundle, "plan.json")
        wav, codes, pcm = (os.path.join(out, f"{k}-{prec}.{e}") for k, e in (("say", "wav"), ("codes", "npz"), ("say", "pcm")))
        _step(results, f"say {prec} greedy -> wav + codes", _qtts(*say, "--plan", plan, "--greedy", "-o", wav, "--codes-out", codes), t, [wav, codes])
        _step(results, f"say {prec} greedy -> stdout", _qtts(*say, "--plan", plan, "--greedy", "-o", "-"), t, stdout_to=pcm)
        dec = os.path.join(out, f"decode-{prec}.wav")
        _step(results, f"decode {prec}", _qtts("decode", codes, "-m", args.model, "--plan", plan, "--force", "-o", dec), t, [dec])
        if args.codes_from:  # the other machine's codes: the vocoder compared on identical input
            ref, dec = os.path.join(args.codes_from, f"codes-{prec}.npz"), os.path.join(out, f"decode-ref-{prec}.wav")
            _step(results, f"decode {prec} of the x86 codes", _qtts("decode", ref, "-m", args.model, "--plan", plan, "--force", "-o", dec), t, [dec])
        if prec == "fp32":
            seeded = [os.path.join(out, n) for n in ("say-fp32-seed.wav", "codes-fp32-seed.npz")]
            _step(results, "say fp32 seed 7", _qtts(*say, "--plan", plan, "--seed", str(SEED), "-o", seeded[0], "--codes-out", seeded[1]), t, seeded)
            plain = os.path.join(out, "say-fp32-plain.wav")
            _step(results, "say fp32 greedy, QTTS_KERNELS=0", _qtts(*say, "--plan", plan, "--greedy", "-o", plain), t, [plain],
                  env={**env, "QTTS_KERNELS": "0"})
            _serve(results, out, args.model, plan, t)
            _wyoming(results, out, args.model, plan, t)
    versions = {"machine": platform.machine(), "python": platform.python_version(), "libc": " ".join(platform.libc_ver())}
    for mod in ("qtts", "numpy", "onnxruntime", "tokenizers", "soundfile", "soxr", "wyoming", "fastapi", "uvicorn"):
        try:
            versions[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            versions[mod] = "-"
    versions["torch"] = "installed" if _importable("torch") else "not installed"
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as fh:
        json.dump({"versions": versions, "results": results}, fh, indent=1)
    return 0 if all(r["rc"] == 0 for r in results) else 1


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--model", required=True)
    r.add_argument("--bundle", action="append", required=True, help="PREC=DIR, e.g. fp32=bundle-fp32")
    r.add_argument("--timeout", type=float, default=900.0, help="seconds per command")
    r.add_argument("--codes-from", help="also decode the codes-PREC.npz of another run (the x86 side's out)")
    c = sub.add_parser("compare")
    c.add_argument("x86")
    c.add_argument("arm")
    c.add_argument("--markdown")
    a = p.parse_args()
    if a.what == "run":
        sys.exit(run(a))
    from arm_compare import compare  # benchmarks/arm_compare.py, beside this file

    sys.exit(compare(a.x86, a.arm, a.markdown))
