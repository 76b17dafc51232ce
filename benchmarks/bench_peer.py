"""The C++ peer qwentts.cpp in qtts's benchmark table (docs/history/performance.md, "Peer").

The peer is the RealtimeTTS CPU wheel ``realtimetts-qwen-native-cpu`` (qwentts.cpp fork, ggml,
AVX2 build) in its own venv (``bash scripts/setup_peer_env.sh`` -> .venv-peer). Subcommands:

  convert CKPT OUT_DIR --type F32 Q8_0 Q4_K_M    [.venv-peer] our GGUF writer (benchmarks/peer_gguf.py)
  run --gguf-dir DIR --type Q4_K_M Q8_0 ...       [.venv-peer] measure; JSON rows shaped like `qtts bench --json`
  table BENCH.json PEER.json [--plot PNG]         [.venv] one markdown table for all rows

The conversion check (greedy codes and audio vs qtts) is benchmarks/peer_check.py.

``run`` method, as close to ``qtts bench`` as the peer allows: the same text, language 'auto',
the same fixed random x-vector (Base) or the first speaker (CustomVoice), the checkpoint's
sampling defaults, ``cpu_threads`` = --threads, streaming through ``QwenTTS.stream``. The peer
cannot block EOS, so a run that stops early is discarded and the next seed tried; the first full
run of the chosen seed is the warm-up, then --repeats measured runs (medians). Stage times come
from the peer's own ``[Perf]`` log lines; TTFA is measured here (call -> first audio chunk).
Each variant runs in a fresh child process (clean peak RSS); CPU used by other processes is
sampled from /proc/stat around every run, and --idle-gate waits for a quiet machine first
(the peer slows 3-10x when another process takes a core).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank today."  # = qtts.tools.bench.TEXT
SR, HOP = 24000, 1920
XVEC_SEED, XVEC_SCALE = 1234, 0.05  # = qtts.export.verify._prompt: the benchmark's fixed x-vector
PERF = re.compile(r"\[Perf\] (\w+) ([\d.]+) ms")
# fallbacks for a GGUF without generation.* keys = the released checkpoints' generation_config.json
SAMPLING = {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
            "subtalker_do_sample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50,
            "subtalker_top_p": 1.0}  # fmt: skip


class InputError(Exception):
    """Bad arguments or missing files: one line on stderr, exit 2."""


# ---------------------------------------------------------------------------------- machine load
# The same /proc sampling as qtts.tools.bench: `run` executes in .venv-peer, where qtts (and numpy,
# onnxruntime) are not installed, so it cannot import them; keep the two in step.


def busy_jiffies() -> tuple[int, int]:
    """(busy jiffies of the machine, jiffies of this process and its threads); (0, 0) without /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as fh:
            mine = fh.read().rsplit(")", 1)[1].split()
        return f[0] + f[1] + f[2] + f[5] + f[6] + f[7], int(mine[11]) + int(mine[12])
    except (OSError, IndexError, ValueError):
        return 0, 0


def foreign_cores(before: tuple, after: tuple, seconds: float) -> float:
    """CPU cores used by *other* processes between two :func:`busy_jiffies` samples."""
    busy = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, busy / os.sysconf("SC_CLK_TCK") / max(seconds, 1e-9))


def wait_idle(limit: float | None, window_s: float = 3.0, timeout_s: float = 900.0) -> tuple[bool, float]:
    """Wait until other processes use < ``limit`` cores over ``window_s``; (idle, last measurement)."""
    t_end = time.monotonic() + timeout_s
    while True:
        j0, t0 = busy_jiffies(), time.perf_counter()
        time.sleep(window_s)
        load = foreign_cores(j0, busy_jiffies(), time.perf_counter() - t0)
        if limit is None or load < limit:
            return True, load
        if time.monotonic() > t_end:
            return False, load
        print(
            f"bench_peer: waiting for an idle machine ({load:.2f} foreign cores >= {limit})", file=sys.stderr
        )


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def loadavg() -> float | None:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except OSError:
        return None


# ---------------------------------------------------------------------------------- the peer


def open_peer(talker: Path, codec: Path, threads: int, codec_threads: int = 0):
    """(QwenTTS, perf lines list, conditioning kwargs) for ``talker``/``codec`` GGUFs."""
    try:
        import qwentts_cpp_cpu as peer
    except ImportError as exc:
        raise InputError("the peer wheel is not importable: run `bash scripts/setup_peer_env.sh` and "
                         "use .venv-peer/bin/python") from exc  # fmt: skip
    for path in (talker, codec):
        if not path.is_file():
            raise InputError(
                f"{path} does not exist: write it with `bench_peer.py convert` (or run --model CKPT)"
            )
    lines: list[str] = []
    tts = peer.QwenTTS(talker, codec, cpu_threads=threads, cpu_codec_threads=codec_threads)
    tts.set_log_callback(lambda _level, msg: lines.append(msg))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peer_gguf_layout import gguf_kv

    kv = gguf_kv(talker, {"qwen3-tts.spk_enc.embedding_length", "qwen3-tts.talker.embedding_length",
                          *(f"generation.{k}" for k in SAMPLING)})  # fmt: skip
    speakers = tts.speaker_names()
    if speakers:
        cond = {"speaker": speakers[0]}
    else:  # qtts bench's fixed x-vector
        dim = int(kv.get("qwen3-tts.spk_enc.embedding_length") or kv["qwen3-tts.talker.embedding_length"])
        cond = {
            "ref_spk_emb": np.random.default_rng(XVEC_SEED).standard_normal(dim).astype(np.float32)
            * XVEC_SCALE
        }
    # the checkpoint's sampling defaults (generation_config.json, carried in the GGUF), as qtts bench
    cond.update({k: kv.get(f"generation.{k}", v) for k, v in SAMPLING.items()})
    return tts, lines, cond


def peer_run(
    tts, lines: list, cond: dict, frames: int, seed: int, greedy: bool = False, dump_dir=None
) -> dict:
    """One streamed synthesis; wall times measured here, stage times from the peer's [Perf] lines."""
    cond = dict(cond, do_sample=False, subtalker_do_sample=False) if greedy else cond
    lines.clear()
    audio, ttfa = [], None
    jiffies, t0 = busy_jiffies(), time.perf_counter()
    for chunk, _sr in tts.stream(
        text=TEXT, lang="auto", seed=seed, max_new_tokens=frames, dump_dir=dump_dir, **cond
    ):
        ttfa = ttfa if ttfa is not None else time.perf_counter() - t0
        audio.append(chunk)
    total = time.perf_counter() - t0
    pcm = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    perf = {m.group(1): float(m.group(2)) for m in map(PERF.search, lines) if m}
    return {"frames": len(pcm) // HOP, "audio_s": len(pcm) / SR, "total_s": total, "ttfa_s": ttfa or total,
            "foreign_cores": foreign_cores(jiffies, busy_jiffies(), total), "perf": perf, "pcm": pcm}  # fmt: skip


def row_of(runs: list, label: str) -> dict:
    """Medians over ``runs`` in the row shape of ``qtts bench --json`` (plus peer-only fields)."""
    med = lambda f: float(np.median([f(r) for r in runs]))  # noqa: E731
    n = runs[0]["frames"]
    stage = lambda key: med(lambda r: r["perf"].get(key, 0.0))  # noqa: E731
    total_ms = med(lambda r: 1000.0 * r["total_s"])
    known = stage("Prefill") + stage("TalkerDecode") + stage("CodePredictor") + stage("CodecDecode")
    row = {
        "label": label, "frames": n, "audio_s": runs[0]["audio_s"], "total_s": total_ms / 1000.0,
        "foreign_cores": med(lambda r: r["foreign_cores"]), "ttfa_ms": med(lambda r: 1000.0 * r["ttfa_s"]),
        "prefill_ms": stage("Prefill"), "talker_ms": stage("TalkerDecode") / n,
        "predictor_ms": stage("CodePredictor") / n, "vocoder_ms": stage("CodecDecode") / n,
        "other_ms": (total_ms - known) / n,
        "peer_ttfa_codes_ms": stage("TTFA"), "peer_host_ms": stage("HostCompose") / n,
        "peer_total_ms": stage("Total"),
    }  # fmt: skip
    row["frames_per_s"] = n / row["total_s"]
    row["rtf"] = row["total_s"] / max(row["audio_s"], 1e-9)
    row["runs_total_s"] = [round(r["total_s"], 3) for r in runs]
    row["runs_foreign_cores"] = [round(r["foreign_cores"], 2) for r in runs]
    row["min_total_s"] = min(r["total_s"] for r in runs)
    return row


def measure(args) -> dict:
    """Child process: load one variant, find a seed that reaches --frames, time --repeats runs."""
    t0 = time.perf_counter()
    tts, lines, cond = open_peer(Path(args.talker), Path(args.codec), args.threads, args.codec_threads)
    load_s = time.perf_counter() - t0
    rejected, seed = [], args.seed
    while True:  # the first full run of a seed doubles as the warm-up
        warm = peer_run(tts, lines, cond, args.frames, seed)
        if warm["frames"] >= args.frames:
            break
        rejected.append([seed, warm["frames"]])
        if len(rejected) >= args.seed_tries:
            raise RuntimeError(f"{len(rejected)} seeds stopped early (EOS): {rejected}")
        seed += 1
    runs = [peer_run(tts, lines, cond, args.frames, seed) for _ in range(args.repeats)]
    if not all("Total" in r["perf"] for r in runs):
        raise RuntimeError(
            "the peer printed no [Perf] lines: this wheel's log format is not the one parsed here"
        )
    import qwentts_cpp_cpu as peer

    row = row_of(runs, f"qwentts.cpp {args.variant} (realtimetts-qwen-native-cpu {peer.__version__})")
    row.update(variant=args.variant, seed=seed, seeds_stopped_early=rejected, load_s=load_s, rss_mb=rss_mb(),
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, loadavg=loadavg(),
               threads=args.threads, codec_threads=args.codec_threads, library=tts.library.version())  # fmt: skip
    tts.close()
    return row


# ---------------------------------------------------------------------------------- subcommands


def gguf_pair(gguf_dir: Path, variant: str) -> tuple[Path, Path]:
    return gguf_dir / f"talker-{variant}.gguf", gguf_dir / f"codec-{variant}.gguf"


def ensure_ggufs(args, variant: str) -> tuple[Path, Path]:
    talker, codec = gguf_pair(args.gguf_dir, variant)
    if not (talker.is_file() and codec.is_file()):
        if args.model is None:
            raise InputError(
                f"{talker.name} / {codec.name} missing in {args.gguf_dir}: pass --model CKPT to convert"
            )
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from peer_gguf import convert

        convert(args.model, args.gguf_dir, variant, args.tokenizer)
    return talker, codec


def cmd_run(args) -> int:
    """Each variant in a child process (after the idle gate); rows -> --json like ``qtts bench``."""
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise InputError(f"--json {args.json}: its folder does not exist")  # before minutes of benchmarking
    rows = []
    for variant in args.type:
        talker, codec = ensure_ggufs(args, variant)
        idle, load = wait_idle(args.idle_gate, timeout_s=args.idle_timeout)
        cmd = [sys.executable, __file__, "_measure", "--talker", str(talker), "--codec", str(codec),
               "--variant", variant, "--frames", str(args.frames), "--threads", str(args.threads),
               "--codec-threads", str(args.codec_threads), "--repeats", str(args.repeats),
               "--seed", str(args.seed), "--seed-tries", str(args.seed_tries)]  # fmt: skip
        child = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if child.returncode != 0:
            raise InputError(f"measuring {variant} failed (exit {child.returncode}); its error is above")
        row = json.loads(child.stdout.strip().splitlines()[-1])
        row.update(idle_gate=args.idle_gate, idle_before=idle, foreign_before=round(load, 2))
        rows.append(row)
        print(f"{row['label']}: RTF {row['rtf']:.2f}, TTFA {row['ttfa_ms']:.0f} ms, talker {row['talker_ms']:.1f} "
              f"+ predictor {row['predictor_ms']:.1f} + codec {row['vocoder_ms']:.1f} ms/frame, "
              f"foreign load {row['foreign_cores']:.2f}", file=sys.stderr)  # fmt: skip
        if row["foreign_cores"] > 0.2:
            print("bench_peer: other processes used > 0.2 cores during these runs: not comparable "
                  "(the peer slows 3-10x or worse; rerun with --idle-gate 0.1)", file=sys.stderr)  # fmt: skip
    keep = ("frames", "repeats", "threads", "seed", "codec_threads")
    opts = {k: v for k, v in vars(args).items() if k in keep} | {"text": TEXT}
    if args.json:
        write_json(args.json, {"options": opts, "results": rows, "official": None, "peer": peer_info()})
    return 0


def peer_info() -> dict:
    import qwentts_cpp_cpu as peer

    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0].split()
    return {"wheel": f"realtimetts-qwen-native-cpu {peer.__version__}", "library": peer.QwenLibrary().version(),
            "build": "AVX2/FMA/F16C baseline (no AVX-512 kernels)", "cpu_avx512f": "avx512f" in flags,
            "cpu_avx2": "avx2" in flags, "cpus": os.cpu_count()}  # fmt: skip


def write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


def cmd_table(args) -> int:
    """[main venv] all rows of ``qtts bench --json`` files and ``run --json`` files in one table."""
    from qtts.tools.bench import plot, table_markdown

    results, official = [], None
    for path in args.files:
        data = json.loads(Path(path).read_text())
        results += data.get("results", [])
        official = official or data.get("official")
    print(table_markdown(results, official))
    if args.plot:
        plot(results, args.plot, official)
    return 0


def add_common(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` here and ``benchmarks/peer_check.py``."""
    p.add_argument("--gguf-dir", type=Path, required=True, help="holds talker-<TYPE>.gguf, codec-<TYPE>.gguf")
    p.add_argument("--model", type=Path, help="the checkpoint: converts missing GGUFs")
    p.add_argument("--tokenizer", type=Path, help="vocab.json + merges.txt dir if the checkpoint lacks them")
    p.add_argument("--threads", type=int, default=2, help="cpu_threads of the peer (qtts bench: --threads)")
    p.add_argument("--json", help="write the results here")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert", help="write the peer's GGUFs (= benchmarks/peer_gguf.py)")
    conv.add_argument("argv", nargs=argparse.REMAINDER)
    run = sub.add_parser("run", help="measure GGUF variants of the peer")
    add_common(run)
    run.add_argument("--type", nargs="+", default=["Q4_K_M", "Q8_0"], choices=("F32", "Q8_0", "Q4_K_M"))
    run.add_argument("--frames", type=int, default=64, help="frames per run (12.5 = 1 s of audio)")
    run.add_argument("--repeats", type=int, default=3, help="measured runs per variant (medians)")
    run.add_argument("--seed", type=int, default=0, help="first seed tried (the peer cannot block EOS)")
    run.add_argument("--seed-tries", type=int, default=8)
    run.add_argument("--codec-threads", type=int, default=0, help="the wheel's codec overlap pool (0 = off)")
    run.add_argument(
        "--idle-gate",
        type=float,
        default=None,
        help="wait until other processes use < this many cores (e.g. 0.1) before each variant",
    )
    run.add_argument("--idle-timeout", type=float, default=900.0, help="seconds to wait for --idle-gate")
    table = sub.add_parser("table", help="qtts bench + peer rows in one markdown table")
    table.add_argument("files", nargs="+", help="`qtts bench --json` and `bench_peer.py run --json` files")
    table.add_argument("--plot", help="also write the stacked-bar PNG (qtts.tools.bench.plot)")
    m = sub.add_parser("_measure")  # internal: one variant, in a child process; prints one JSON row
    for flag in ("--talker", "--codec", "--variant"):
        m.add_argument(flag, required=True)
    for flag in ("--frames", "--threads", "--codec-threads", "--repeats", "--seed", "--seed-tries"):
        m.add_argument(flag, type=int, required=True)
    return ap  # fmt: skip


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "convert":
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from peer_gguf import main as convert_main

            return convert_main(args.argv)
        if args.cmd == "_measure":
            print(json.dumps(measure(args)))
            return 0
        return {"run": cmd_run, "table": cmd_table}[args.cmd](args)
    except InputError as exc:
        print(f"bench_peer: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
