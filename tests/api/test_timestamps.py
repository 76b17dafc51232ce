"""Word timestamps on TTS.stream / stream_text / synthesize (issue 41): the forced aligner on a tiny random
checkpoint, torch and int8 ONNX, and the piece-level times without one.

Random weights give arbitrary word times: these tests check the mechanism (which words, in which
order, inside which piece's audio, never before that audio, the same audio with timestamps on),
and that the stream's times are the aligner's own times on the piece's audio, offset to the stream.
"""

from __future__ import annotations

import numpy as np
import pytest

import qtts
from conftest import REAL_TOKENIZER_DIR
from qtts.align import ForcedAligner
from qtts.align.runtime import ENV_ALIGNER, AlignerSlot, open_aligner, plan_runtime
from qtts.align.timing import PIECE, WORD, word_language
from qtts.config import FRAME_RATE, SAMPLES_PER_FRAME
from qtts.errors import InputError
from qtts.options import SynthesisOptions
from qtts.plans.plan import parse_plan
from qtts.text.words import split_words
from qtts.tools.random_checkpoint import write_random_checkpoint

TEXT = "Hello there, this is the first sentence. And here comes the second one, a bit longer."
#: four pieces of at most 30 characters, 12 frames each (random weights seldom stop by themselves)
OPTS = SynthesisOptions(max_frames=12, seed=1, max_sentence_chars=30, watchdog=False)


@pytest.fixture(scope="module")
def aligner_dir(tmp_path_factory):
    return write_random_checkpoint(str(tmp_path_factory.mktemp("al") / "tiny"), kind="forced_aligner",
                                   tokenizer_dir=REAL_TOKENIZER_DIR, seed=3)  # fmt: skip


@pytest.fixture(scope="module")
def cv(tiny_snapshot):
    return tiny_snapshot(kind="custom_voice")


@pytest.fixture(autouse=True)
def no_default_aligner(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_ALIGNER, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # no official aligner in the cache


def _run(tts, text=TEXT, **kw):
    chunks = list(tts.stream(text, speaker=tts.speakers[0], options=OPTS, **kw))
    return chunks, [w for c in chunks for w in c.words]


def _piece_spans(tts) -> list[tuple[float, float, str]]:
    pieces = tts.synth.pieces(TEXT, OPTS)
    return [(i * OPTS.max_frames / FRAME_RATE, (i + 1) * OPTS.max_frames / FRAME_RATE, p) for i, p in enumerate(pieces)]


def test_without_an_aligner_each_piece_gets_its_exact_span(cv):
    tts = qtts.load(cv)
    assert tts.aligner is None
    chunks, words = _run(tts, timestamps=True)
    spans = _piece_spans(tts)
    assert len(spans) == 4
    assert [(w.start, w.end, w.text, w.unit, w.piece) for w in words] == [
        (pytest.approx(a), pytest.approx(b), p, PIECE, i) for i, (a, b, p) in enumerate(spans)]
    assert words[-1].end == pytest.approx(sum(len(c.samples) for c in chunks) / 24000)
    plain, _ = _run(tts)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]),
                                  np.concatenate([c.samples for c in plain]))  # fmt: skip
    assert not any(c.words for c in plain)


def test_words_are_the_aligners_times_on_each_pieces_audio(cv, aligner_dir):
    tts = qtts.load(cv, aligner=aligner_dir)
    chunks, words = _run(tts, timestamps=True)
    audio = np.concatenate([c.samples for c in chunks])
    plain = np.concatenate([c.samples for c in _run(tts)[0]])
    np.testing.assert_array_equal(audio, plain)  # alignment never changes the audio
    assert tts.aligner.runtime == "torch"  # beside the torch plan
    reference = ForcedAligner.from_dir(aligner_dir)
    want = []
    for i, (a, b, piece) in enumerate(_piece_spans(tts)):
        clip = audio[round(a * 24000) : round(b * 24000)]
        for w in reference.align(clip, 24000, piece, "auto"):
            want.append((w.text, round(a + min(max(w.start, 0), b - a), 3), round(a + min(max(w.end, 0), b - a), 3), i))
    assert [(w.text, w.start, w.end, w.piece) for w in words] == want
    assert all(w.unit == WORD for w in words)
    assert [w.text for w in words] == split_words(TEXT, "English")


def test_words_never_arrive_before_their_audio(cv, aligner_dir):
    tts = qtts.load(cv, aligner=aligner_dir)
    chunks, _ = _run(tts, timestamps=True)
    frames_out = 0
    for chunk in chunks:
        frames_out += chunk.num_frames
        for w in chunk.words:
            assert w.end * FRAME_RATE <= frames_out + 1e-6, (w, frames_out)
    assert chunks[-1].is_final and sum(len(c.words) for c in chunks) == 16
    assert [c.frame_start for c in chunks] == list(np.cumsum([0] + [c.num_frames for c in chunks[:-1]]))


def test_synthesize_returns_the_words_and_speed_scales_them(cv):
    tts = qtts.load(cv)
    normal = tts.synthesize(TEXT, speaker=tts.speakers[0], options=OPTS, timestamps=True)
    fast = tts.synthesize(TEXT, speaker=tts.speakers[0], options=SynthesisOptions(**{**OPTS.__dict__, "speed": 2.0}),
                          timestamps=True)  # fmt: skip
    assert len(normal.words) == 4 and normal.words[-1].end == pytest.approx(4 * 12 / FRAME_RATE)
    assert [w.end for w in fast.words] == pytest.approx([w.end / 2 for w in normal.words])


def test_live_text_times_each_talker_context(cv):
    tts = qtts.load(cv)
    parts = ["Hello there. ", "This is ", "live text."]
    opts = SynthesisOptions(max_frames=10, seed=1, watchdog=False)
    chunks = list(tts.stream_text(iter(parts), speaker=tts.speakers[0], options=opts, timestamps=True))
    words = [w for c in chunks for w in c.words]
    frames = sum(c.num_frames for c in chunks)
    assert words and all(w.unit == PIECE for w in words)
    assert " ".join(w.text for w in words) == "".join(parts).strip()
    assert words[0].start == 0 and words[-1].end == pytest.approx(frames / FRAME_RATE)
    assert all(a.end == b.start for a, b in zip(words, words[1:]))


def test_int8_onnx_aligner_from_the_cache(aligner_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path / "cache"))
    onnx8 = open_aligner(aligner_dir, "onnx-int8")
    again = open_aligner(aligner_dir, "onnx-int8")
    assert onnx8.runtime == "onnx-int8" and again.model.path == onnx8.model.path  # exported once, then reused
    assert sorted(p.name for p in (tmp_path / "cache" / "aligner").iterdir()) == [
        p.name for p in (tmp_path / "cache" / "aligner").iterdir() if p.name.endswith("-int8")]
    from qtts.align import runtime

    folder = (tmp_path / "cache" / "aligner").iterdir().__next__()
    runtime._export(aligner_dir, "int8", str(folder))  # a second process losing the race uses the first's graph
    assert (folder / "aligner.onnx").is_file() and [p.name for p in folder.parent.iterdir()] == [folder.name]
    fp32 = open_aligner(aligner_dir, "onnx")
    torch_ = ForcedAligner.from_dir(aligner_dir)
    wav = np.random.default_rng(0).standard_normal(3 * SAMPLES_PER_FRAME * 12).astype(np.float32) * 0.1
    text = "Hello there, this is short."
    assert fp32.align(wav, 24000, text, "English") == torch_.align(wav, 24000, text, "English")
    assert [w.text for w in onnx8.align(wav, 24000, text, "English")] == split_words(text, "English")


def test_the_plan_picks_the_aligner_runtime(tmp_path):
    graph = tmp_path / "a.onnx"
    graph.write_bytes(b"x")
    assert plan_runtime(parse_plan({})) == ("torch", None)
    fast = {"talker": {"impl": "onnx", "artifacts": {"main": str(graph)}, "precision": "int8"}}
    assert plan_runtime(parse_plan(fast)) == ("onnx-int8", None)
    faithful = {"talker": {"impl": "onnx", "artifacts": {"main": str(graph)}, "precision": "fp32"}}
    assert plan_runtime(parse_plan(faithful)) == ("onnx", None)
    named = {**fast, "aligner": {"impl": "onnx", "precision": "fp32", "artifacts": {"main": str(graph)}}}
    assert plan_runtime(parse_plan(named)) == ("onnx", str(graph))
    assert plan_runtime(parse_plan({**fast, "aligner": {"impl": "torch"}})) == ("torch", None)
    with pytest.raises(InputError, match="aligner runs on torch or onnx"):
        plan_runtime(parse_plan({"aligner": {"impl": "rknn", "artifacts": {"main": str(graph)}}}))


def test_a_bad_aligner_path_fails_at_load(tmp_path):
    with pytest.raises(InputError, match="no such snapshot directory"):
        AlignerSlot(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no config.json"):
        AlignerSlot(str(tmp_path / "empty"))


def test_auto_language_picks_the_word_split():
    assert word_language("auto", "こんにちは世界") == "japanese"
    assert word_language("auto", "안녕하세요") == "korean"
    assert word_language("auto", "你好 world") == "auto"
    assert word_language("English", "こんにちは") == "english"


def test_the_aligner_thread_yields_to_the_generation():
    import os
    import threading

    from qtts.align.runtime import ALIGNER_NICE, AlignerWorker

    worker = AlignerWorker(None)
    try:
        nice = worker.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
    finally:
        worker.close()
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + ALIGNER_NICE) > os.getpriority(os.PRIO_PROCESS, 0)


def test_every_tts_of_the_process_shares_one_aligner(cv, aligner_dir, tmp_path):
    import shutil

    own = shutil.copytree(aligner_dir, tmp_path / "aligner")  # no other test's TTS holds this one
    a, b = qtts.load(cv, aligner=str(own)), qtts.load(cv, aligner=str(own))
    shared = a.aligner
    assert shared is b.aligner  # one model, one worker thread (qtts serve --max-concurrency K)
    a.close()
    words = b.synthesize("Hello there.", speaker=b.speakers[0], options=OPTS, timestamps=True).words
    assert words and all(w.unit == WORD for w in words)
    b.close()
    c = qtts.load(cv, aligner=str(own))
    assert c.aligner is not None and c.aligner is not shared  # the last close unloaded it
    c.close()


def _cached_aligner(hub, snapshot_files: dict) -> None:
    """An HF cache with the official aligner's id holding ``snapshot_files``."""
    repo = hub / "models--Qwen--Qwen3-ForcedAligner-0.6B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for name, text in snapshot_files.items():
        (snap / name).write_text(text)


def test_a_found_aligner_that_cannot_load_falls_back_to_pieces(cv, tmp_path, monkeypatch, caplog):
    _cached_aligner(tmp_path / "hub", {"config.json": "{}"})
    tts = qtts.load(cv)
    assert tts.synth._aligner is None  # not looked up before a timestamps call
    words = tts.synthesize("Hello there.", speaker=tts.speakers[0], options=OPTS, timestamps=True).words
    assert [w.unit for w in words] == [PIECE]
    assert "did not load" in caplog.text and "fall back to whole text pieces" in caplog.text


def test_a_named_aligner_that_cannot_load_is_an_error(cv, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    tts = qtts.load(cv, aligner=str(tmp_path / "broken"))
    with pytest.raises(InputError):
        tts.synthesize("Hello there.", speaker=tts.speakers[0], options=OPTS, timestamps=True)
