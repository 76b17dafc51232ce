"""TTS with max_batch > 1: stream() from several threads shares one batch and gives each caller the
audio it gets alone; closing one stream leaves the others alone; nothing is held afterwards."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from qtts.api import TTS
from qtts.backends import open as open_parts
from qtts.options import SynthesisOptions
from support.batch_util import TEXTS, voices


@pytest.fixture(scope="module")
def parts(tiny_snapshot):
    import torch

    torch.set_num_threads(1)
    return open_parts(tiny_snapshot(), threads=1)


def _jobs(parts):
    xv, icl = voices(parts.config)
    return [
        (TEXTS[0], xv, SynthesisOptions(greedy=True, max_frames=10)),
        (TEXTS[1], icl, SynthesisOptions(seed=7, max_frames=14)),
        (TEXTS[2], xv, SynthesisOptions(seed=8, max_frames=6)),
        (TEXTS[3], icl, SynthesisOptions(greedy=True, max_frames=9)),
    ]


def _threads(fn, n):
    out, errors = [None] * n, []

    def run(i):
        try:
            out[i] = fn(i)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


def test_streams_from_threads_share_the_batch_and_equal_alone(parts):
    jobs = _jobs(parts)
    single = TTS(parts)
    assert single.batch is None
    ref = [single.synthesize(text, voice=voice, options=opts) for text, voice, opts in jobs]
    tts = TTS(parts, max_batch=3)
    assert tts.thread_safe
    steps = []
    tts.batch.add_observer(steps.append)
    try:
        got = _threads(lambda i: tts.synthesize(jobs[i][0], voice=jobs[i][1], options=jobs[i][2]), len(jobs))
    finally:
        tts.close()
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a.finish_reason == b.finish_reason, i
        np.testing.assert_array_equal(a.samples, b.samples, err_msg=f"job {i}")
    assert max(s.rows for s in steps) == 3  # four callers, three rows: they really shared steps
    assert sum(s.predicted for s in steps) == sum(len(a.samples) for a in ref) // 1920


def test_closing_one_stream_leaves_the_others_and_frees_its_row(parts):
    jobs = _jobs(parts)
    single = TTS(parts)
    ref = [single.synthesize(text, voice=voice, options=opts) for text, voice, opts in jobs[:2]]
    tts = TTS(parts, max_batch=3)
    stop = threading.Event()

    def consume(i):
        if i == 2:  # reads its first chunk, then leaves
            stream = tts.stream(TEXTS[4], voice=jobs[0][1], options=SynthesisOptions(greedy=True, max_frames=40))
            first = next(stream)
            stream.close()
            stop.set()
            return first
        return tts.synthesize(jobs[i][0], voice=jobs[i][1], options=jobs[i][2])

    try:
        got = _threads(consume, 3)
        assert stop.is_set() and got[2].num_frames == SynthesisOptions().first_chunk_frames
        for a, b in zip(ref, got[:2]):
            np.testing.assert_array_equal(a.samples, b.samples)
        engine = tts.batch
        for _ in range(200):  # the engine drops the closed stream at its next step
            if engine.active == 0 and engine.waiting == 0:
                break
            threading.Event().wait(0.05)
        assert engine.active == 0 and engine.waiting == 0
    finally:
        tts.close()


def test_close_ends_running_streams_and_is_idempotent(parts):
    tts = TTS(parts, max_batch=2)
    xv = voices(parts.config)[0]
    stream = tts.stream(TEXTS[1], voice=xv, options=SynthesisOptions(greedy=True, max_frames=200))
    first = next(stream)
    assert first.num_frames == SynthesisOptions().first_chunk_frames
    tts.close()
    tts.close()
    rest = list(stream)
    assert rest[-1].is_final and rest[-1].finish_reason == "cancelled"
    # a closed engine is replaced by a fresh one on the next call
    audio = tts.synthesize(TEXTS[0], voice=xv, options=SynthesisOptions(greedy=True, max_frames=4))
    assert audio.finish_reason in ("length", "eos")
    tts.close()


def test_bench_concurrency_cli(tiny_snapshot, tmp_path, capsys):
    """`qtts bench --concurrency`: one batched engine and K engines per level, one table, a JSON file."""
    import json

    from qtts.cli import main

    out = tmp_path / "conc.json"
    assert main(["bench", "-m", tiny_snapshot(), "--concurrency", "1,2", "--frames", "4", "--repeats", "1",
                 "--threads", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| torch fp32 | 2 | 1 batched engine |" in text and "| torch fp32 | 2 | 2 engine(s) |" in text
    rows = json.loads(out.read_text())["concurrency"]
    assert {(r["streams"], r["mode"]) for r in rows} == {(1, "batched"), (1, "engines"), (2, "batched"),
                                                          (2, "engines")}  # fmt: skip
    for r in rows:
        assert r["aggregate"] > 0 and len(r["ttfa_s"]) == r["streams"] and r["ttfa_p95"] >= r["ttfa_p50"] > 0


def test_bench_concurrency_of_one_stream_runs_a_batched_engine(tiny_snapshot, capsys):
    """`--concurrency 1` compares one stream on a batched engine with one engine (it crashed: a
    max_batch of 1 made no batch engine)."""
    from qtts.cli import main

    assert main(["bench", "-m", tiny_snapshot(), "--concurrency", "1", "--frames", "4", "--repeats", "1",
                 "--threads", "1"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "| torch fp32 | 1 | 1 batched engine |" in text and "| torch fp32 | 1 | 1 engine(s) |" in text


@pytest.mark.parametrize("levels", ["0", "1,x", "", "1,65"])
def test_bench_concurrency_refuses_bad_levels(levels, capsys):
    from qtts.cli import main

    assert main(["bench", "-m", "M", "--concurrency", levels]) == 2
    assert "argument --concurrency" in capsys.readouterr().err


def test_live_text_streams_share_the_batch_and_equal_alone(tiny_snapshot):
    """stream_text (one LLM fast, one slow: its row waits for text while the others step) and a
    plain stream in one batch: each gets the codes it gets alone, and its audio (the live streams'
    chunks are cut where the talker waits, so their samples match to 1e-5, as in test_live_real)."""
    from support.live_fakes import StepGate, chunkings, paced

    text = "Hi there, 42 cats; ça va?"
    opts = SynthesisOptions(greedy=True, max_frames=16, split_sentences=False, non_streaming_text=False)
    parts = open_parts(tiny_snapshot(kind="custom_voice"), threads=1)
    speaker = parts.config.speakers[0]
    single = TTS(parts)
    want = single.synthesize(text, speaker=speaker, options=opts)
    plain = single.synthesize(TEXTS[1], speaker=speaker, options=SynthesisOptions(seed=3, max_frames=12))
    tts = TTS(parts, max_batch=3)
    steps, gate = [], StepGate(4)  # the slow LLM's next word comes 4 batch steps later (a word is 1-3 ids)
    tts.batch.add_observer(steps.append)
    tts.batch.add_observer(gate)
    calls = [
        lambda: tts.stream_text(chunkings(text)["words"], speaker=speaker, options=opts),
        lambda: tts.stream_text(paced(chunkings(text)["words"], gate.wait), speaker=speaker, options=opts),
        lambda: tts.stream(TEXTS[1], speaker=speaker, options=SynthesisOptions(seed=3, max_frames=12)),
    ]
    try:
        got = _threads(lambda i: list(calls[i]()), len(calls))
    finally:
        tts.close()
    for i, (chunks, ref) in enumerate(zip(got, [want, want, plain])):
        np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), ref.codes, err_msg=f"call {i}")
        samples = np.concatenate([c.samples for c in chunks])  # live: other chunk sizes (waits flush)
        np.testing.assert_allclose(samples, ref.samples, atol=1e-5 if i < 2 else 0, err_msg=f"call {i}")
        assert chunks[-1].finish_reason == ref.finish_reason
    assert max(s.rows for s in steps) >= 2
    assert any(s.active > s.rows for s in steps)  # some steps left a stream out: it waited for text


def test_batched_streams_vocode_on_the_shared_batcher_and_a_cancel_storm_leaves_nothing(parts):
    tts = TTS(parts, max_batch=3)
    xv, icl = voices(parts.config)
    calls = []
    tts.vocoder_batch.observer = calls.append
    streams = [tts.stream(TEXTS[i % 4], voice=(xv, icl)[i % 2],
                          options=SynthesisOptions(greedy=True, max_frames=40)) for i in range(6)]  # fmt: skip
    firsts = _threads(lambda i: next(streams[i]), 6)
    assert all(c.num_frames for c in firsts)
    assert tts.vocoder_batch.active == 6 and calls  # every stream's vocoder runs on the batcher
    for s in streams:
        s.close()
    assert tts.vocoder_batch.active == 0 and tts.batch.active + tts.batch.waiting <= 3
    audio = tts.synthesize(TEXTS[0], voice=xv, options=SynthesisOptions(greedy=True, max_frames=4))
    assert len(audio.samples) and tts.vocoder_batch.active == 0
    tts.close()
