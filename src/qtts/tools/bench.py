"""Benchmark: per-component time per frame, frames/s, RTF, time to first audio, peak RSS.

Method (same for every plan): one prompt (a named speaker on CustomVoice checkpoints, else a
fixed random x-vector), the checkpoint's sampling defaults, EOS blocked for ``frames`` frames so
every run generates exactly ``frames`` frames; the loop is :mod:`qtts.engine.generate` and the audio is
decoded streaming with the plan's decoder on the schedule of :class:`qtts.engine.stream.Chunker` (1, 2,
4, 8, 8, ... frames), pipelined (generation on a worker thread, as ``TTS.stream`` does by default)
or serial (``BenchOptions.pipeline``). Each backend call and decoder call is timed; "other" is the
loop/sampling/embedding remainder (serial only: pipelined, the components overlap).
TTFA is the wall time from the start of the run (prompt embedding included, model loading
excluded) to the end of the first chunk's decode. Peak RSS per plan is the process's peak
resident set from just before the plan is loaded to the end of its runs (the peak is reset per
plan on Linux, ``plan_peak_rss_mb``; it includes the interpreter and libraries loaded so far; the
whole process's peak is ``peak_rss_mb``). Medians over ``repeats`` runs after a warm-up.

``--compare-official`` runs the official qwen-tts ``generate`` + ``speech_tokenizer.decode`` on
the same checkpoint in the same process (same threads, same frame count, EOS id set to a
suppressed id, as the baseline benchmark of the official code on this machine kind does).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import resource
import time
from dataclasses import dataclass

import numpy as np

from ..config import SAMPLE_RATE
from .bandwidth import floor_lines, generation_floor, read_bandwidth_gbs

log = logging.getLogger(__name__)

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank today."


@dataclass(frozen=True)
class BenchOptions:
    #: frames per run (EOS blocked), 12.5 frames = 1 s of audio
    frames: int = 64
    #: measured runs per plan (medians reported); a warm-up (:func:`warm_up`) precedes them
    repeats: int = 3
    #: intra-op threads for every runtime
    threads: int = 2
    #: streaming decode schedule: first chunk, then doubling up to ``chunk`` (qtts.engine.stream.Chunker)
    first_chunk: int = 1
    chunk: int = 8
    #: generation on a worker thread, vocoder on the caller's (SynthesisOptions.pipeline)
    pipeline: bool = True
    seed: int = 0
    text: str = TEXT


class Timed:
    """Wraps a backend or vocoder stream; accumulates wall and CPU seconds and calls per method name
    (a talker call over more than one position counts as ``prefill``)."""

    def __init__(self, inner, names: tuple):
        self._inner, self._names = inner, names
        self.times: dict = {}  # wall seconds
        self.cpu: dict = {}  # process CPU seconds
        self.calls: dict = {}

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self._names:
            return attr

        def timed(*args, **kwargs):
            c0, t0 = time.process_time(), time.perf_counter()
            out = attr(*args, **kwargs)
            key = "prefill" if name == "talker" and np.asarray(args[0]).shape[0] > 1 else name
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t0
            self.cpu[key] = self.cpu.get(key, 0.0) + time.process_time() - c0
            self.calls[key] = self.calls.get(key, 0) + 1
            return out

        return timed


class _TimedVocoder:
    """A vocoder whose streams are :class:`Timed` (``decode``); ``streams`` keeps them."""

    batches = False

    def __init__(self, inner):
        self._inner, self.streams = inner, []

    def stream(self):
        self.streams.append(Timed(self._inner.stream(), ("decode",)))
        return self.streams[-1]


def peak_rss_mb() -> float:
    """Peak resident set of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (Linux ``clear_refs`` 5), so that the next
    :func:`window_peak_rss_mb` is the peak of one plan only; False where the kernel has no such knob."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def window_peak_rss_mb() -> float:
    """Peak resident set since the last :func:`reset_peak_rss` (``VmHWM``; the process peak elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return peak_rss_mb()


def rss_mb() -> float:
    """Current resident set (MB): what one plan holds when several plans run in one process."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return peak_rss_mb()


def busy_jiffies() -> tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies of this process); (0, 0) where /proc is missing."""
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
    hz = os.sysconf("SC_CLK_TCK")
    busy = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, busy / hz / max(seconds, 1e-9))


def bench_voice(config) -> dict:
    """The voice every run uses: the first named speaker, else a fixed random x-vector."""
    from ..voice import Voice

    if config.speakers:
        return {"speaker": config.speakers[0]}
    dim = config.speaker_encoder.enc_dim if config.speaker_encoder is not None else config.talker.hidden_size
    vec = np.random.default_rng(1234).standard_normal(dim).astype(np.float32) * 0.05
    return {"voice": Voice(vec, model_size=config.tts_model_size)}


def warm_up(parts, opts: BenchOptions) -> None:
    """What a server pays before it reports ready (:meth:`qtts.TTS.warm`: every vocoder step size built
    and run once; the bf16 step's first call of a size costs 0.25-0.4 s more, Zen 4 VM), then a short
    stream (sessions, caches): the measured runs are the steady state, none of them pays a first call."""
    if parts.vocoder is not None:
        parts.vocoder.warm()
    one_run(parts, 4, opts)


def one_run(parts, frames: int, opts: BenchOptions) -> dict:
    """One :meth:`qtts.TTS.stream` of exactly ``frames`` frames (EOS blocked) over timed parts: the product's
    own synthesis body (:mod:`qtts.engine.synth`), its chunk schedule and pipeline; medians come from
    :func:`_median`. ``timed``: the (backend, vocoder stream) wrappers, for per-method totals."""
    from ..api import TTS
    from ..options import SynthesisOptions

    backend = Timed(parts.backend, ("talker", "predict_frame", "text_embeds", "codec_embeds", "frame_embeds"))
    vocoder = _TimedVocoder(parts.vocoder)
    tts = TTS(dataclasses.replace(parts, backend=backend, vocoder=vocoder, max_batch=1))
    tts.synth.exact_frames = True
    options = SynthesisOptions(max_frames=frames, seed=opts.seed, first_chunk_frames=opts.first_chunk,
                               chunk_frames=opts.chunk, pipeline=opts.pipeline, split_sentences=False)  # fmt: skip
    n, ttfa, samples = 0, None, 0
    jiffies, c0, t0 = busy_jiffies(), time.process_time(), time.perf_counter()
    for chunk in tts.stream(opts.text, options=options, **bench_voice(parts.config)):
        n += chunk.num_frames
        samples += len(chunk.samples)
        if ttfa is None and len(chunk.samples):
            ttfa = time.perf_counter() - t0
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    foreign = foreign_cores(jiffies, busy_jiffies(), total)
    decoder = vocoder.streams[-1]
    bt, dt = backend.times, decoder.times
    per = lambda s: 1000.0 * s / max(n, 1)  # noqa: E731
    accounted = sum(bt.values()) + dt.get("decode", 0.0)
    embeds = sum(bt.get(k, 0.0) for k in ("text_embeds", "codec_embeds", "frame_embeds"))
    return {
        "frames": n, "audio_s": samples / SAMPLE_RATE, "total_s": total, "foreign_cores": foreign, "ttfa_ms": 1000.0 * (ttfa or total),
        "prefill_ms": 1000.0 * bt.get("prefill", 0.0), "talker_ms": per(bt.get("talker", 0.0)),
        "predictor_ms": per(bt.get("predict_frame", 0.0)), "vocoder_ms": per(dt.get("decode", 0.0)),
        # two threads overlap: the components then add up to more than the wall time, no remainder
        "other_ms": None if opts.pipeline else per(total - accounted + embeds), "cpu_s": cpu,
        "timed": (backend, decoder),
    }  # fmt: skip


def _median(runs: list) -> dict:
    out = {k: None if runs[0][k] is None else float(np.median([r[k] for r in runs])) for k in runs[0] if k != "timed"}
    out["frames_per_s"] = out["frames"] / out["total_s"]
    out["rtf"] = out["total_s"] / max(out["audio_s"], 1e-9)
    out["runs_total_s"] = [round(r["total_s"], 3) for r in runs]
    out["runs_foreign_cores"] = [round(r["foreign_cores"], 2) for r in runs]
    out["min_total_s"] = min(r["total_s"] for r in runs)
    return out


def bench_plan(model: str, plan, opts: BenchOptions, label: str | None = None) -> dict:
    """Benchmark one plan (None = torch fp32) on ``model``; returns medians and settings."""
    from ..backends import open as open_components

    gc.collect()  # the previous plan's sessions are gone before this plan's peak is measured
    reset_peak_rss()
    t0 = time.perf_counter()
    parts = open_components(model, plan=plan, threads=opts.threads)
    load_s = time.perf_counter() - t0
    warm_up(parts, opts)
    runs = [one_run(parts, opts.frames, opts) for _ in range(opts.repeats)]
    result = _median(runs)
    mode = f"{parts.config.tts_model_size}, {'pipelined' if opts.pipeline else 'serial'}"  # e.g. "0b6, pipelined"
    if opts.pipeline and parts.placement is not None:  # qtts.backends.Placement: generation | workers, decoding
        mode += f", CPUs {parts.placement.generation} | {parts.placement.shared}"
    voc = parts.plan.get("vocoder")
    if label and voc.impl == "torch" and parts.plan.path:  # chosen at load (qtts.plans.plan.with_bf16_vocoder)
        label = label.replace("vocoder fp32", f"vocoder {voc.precision or 'fp32'} (torch)")
    result.update(label=f"{label or (str(plan) if plan else 'torch fp32')} ({mode})", load_s=load_s, pipeline=opts.pipeline)
    result.update(rss_mb=rss_mb(), plan_peak_rss_mb=window_peak_rss_mb(), peak_rss_mb=peak_rss_mb())
    result["loadavg"] = _loadavg()
    result["floor"] = generation_floor(parts.plan, read_bandwidth_gbs(threads=opts.threads), opts.threads)
    return result


def _loadavg() -> float | None:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except OSError:
        return None


def bench_official(model: str, opts: BenchOptions) -> dict:
    """Official qwen-tts generate + decode on the same checkpoint (fp32, same threads and frames)."""
    import torch

    from . import official as _official

    torch.set_num_threads(opts.threads)
    pkg = _official.qwen_tts()
    t0 = time.perf_counter()
    w = pkg.Qwen3TTSModel.from_pretrained(model, dtype=torch.float32)
    load_s = time.perf_counter() - t0
    call = dict(input_ids=w._tokenize_texts([w._build_assistant_text(opts.text)]), languages=["auto"],
                non_streaming_mode=False, eos_token_id=3071)  # fmt: skip
    speakers = list(getattr(w.model.config.talker_config, "spk_id", {}) or {})
    if speakers:
        call["speakers"] = [speakers[0]]
    else:
        dim = w.model.config.speaker_encoder_config.enc_dim
        spk = torch.from_numpy(np.random.default_rng(1234).standard_normal(dim).astype(np.float32) * 0.05)
        call["voice_clone_prompt"] = dict(ref_code=[None], ref_spk_embedding=[spk], x_vector_only_mode=[True],
                                          icl_mode=[False])  # fmt: skip

    def run(frames: int) -> tuple:
        torch.manual_seed(opts.seed)
        jiffies = busy_jiffies()
        t = time.perf_counter()
        with torch.no_grad():
            codes, _ = w.model.generate(max_new_tokens=frames + 1, **call)
            t_gen = time.perf_counter() - t
            wavs, _sr = w.model.speech_tokenizer.decode([{"audio_codes": c} for c in codes])
        total = time.perf_counter() - t
        return t_gen, total, len(codes[0]), len(wavs[0]), foreign_cores(jiffies, busy_jiffies(), total)

    run(4)
    runs = [run(opts.frames) for _ in range(opts.repeats)]
    gen, total = float(np.median([r[0] for r in runs])), float(np.median([r[1] for r in runs]))
    frames, samples = runs[0][2], runs[0][3]
    return {
        "label": "official qwen-tts fp32", "frames": frames, "audio_s": samples / SAMPLE_RATE, "total_s": total,
        "generate_ms": 1000.0 * gen / frames, "vocoder_ms": 1000.0 * (total - gen) / frames,
        "rtf": total / (samples / SAMPLE_RATE), "frames_per_s": frames / total, "ttfa_ms": 1000.0 * total,
        "load_s": load_s, "runs_total_s": [round(r[1], 3) for r in runs], "loadavg": _loadavg(),
        "runs_foreign_cores": [round(r[4], 2) for r in runs], "min_total_s": min(r[1] for r in runs),
    }  # fmt: skip


def table_markdown(results: list, official: dict | None = None) -> str:
    head = ("| plan | talker ms/frame | predictor ms/frame | vocoder ms/frame | other ms/frame | frames/s | RTF "
            "| TTFA ms | prefill ms | peak RSS MB | foreign load (cores) |")  # fmt: skip
    lines = [head, "|" + "---|" * 11]
    for r in results:
        other = "–" if r["other_ms"] is None else f"{r['other_ms']:.1f}"
        lines.append(
            f"| {r['label']} | {r['talker_ms']:.1f} | {r['predictor_ms']:.1f} | {r['vocoder_ms']:.1f} | "
            f"{other} | {r['frames_per_s']:.2f} | {r['rtf']:.2f} | {r['ttfa_ms']:.0f} | "
            f"{r['prefill_ms']:.0f} | {r.get('plan_peak_rss_mb', r['rss_mb']):.0f} | {r['foreign_cores']:.2f} |"
        )
    if official:
        lines.append(
            f"| {official['label']} | {official['generate_ms']:.1f} (talker + predictor) | | "
            f"{official['vocoder_ms']:.1f} | | {official['frames_per_s']:.2f} | {official['rtf']:.2f} | "
            f"{official['ttfa_ms']:.0f} (no streaming) | | | {np.median(official['runs_foreign_cores']):.2f} |"
        )
        lines += ["", "Speed-up (official total time / ours, same frames): " + ", ".join(
            f"{r['label']}: {official['total_s'] / r['total_s']:.2f}x" for r in results)]  # fmt: skip
    return "\n".join(lines + floor_lines(results))


def plot(results: list, path: str, official: dict | None = None) -> None:
    """Stacked bars of per-component ms/frame per plan (matplotlib, extra ``plot``)."""
    from ..errors import require

    matplotlib = require("matplotlib", "plot", "the benchmark plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plot", "the benchmark plot")
    parts = [("talker_ms", "talker"), ("predictor_ms", "code predictor"), ("vocoder_ms", "vocoder"),
             ("other_ms", "other")]  # fmt: skip
    rows = list(results)
    labels = [r["label"] for r in rows]
    fig, ax = plt.subplots(figsize=(11, 0.6 * (len(rows) + 1) + 1.5))
    left = np.zeros(len(rows))
    for key, name in parts:
        vals = np.array([r.get(key) or 0.0 for r in rows])
        ax.barh(labels, vals, left=left, label=name)
        left += vals
    limit = max(float(left.max()), 80.0) * 1.35
    wall = [(i, 80.0 * r["rtf"]) for i, r in enumerate(rows) if r.get("rtf")]  # pipelined parts overlap
    ax.scatter([w for _, w in wall], [i for i, _ in wall], marker="|", s=500, color="black", zorder=3,
               label="wall time per frame (RTF x 80 ms)")  # fmt: skip
    if official:  # usually far off the scale: clipped bar + its value as text
        total = official["generate_ms"] + official["vocoder_ms"]
        ax.barh([official["label"]], [min(total, limit)], color="grey", label="official generate + decode")
        ax.text(
            limit * 0.98,
            len(rows),
            f"{total:.0f} ms/frame",
            ha="right",
            va="center",
            color="white",
            fontsize=8,
        )
    ax.set_xlim(0, limit)
    ax.axvline(80.0, color="red", linestyle="--", label="real time (80 ms/frame)")
    ax.set_xlabel("ms per frame (80 ms of audio)")
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp"
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
