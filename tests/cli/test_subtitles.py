"""qtts say --subtitles (SRT / WebVTT, read back by the srt and webvtt-py parsers) and --words-json, with
a tiny random forced aligner and without one; the cue rules of qtts.align.subtitles."""

from __future__ import annotations

import json

import pytest
import soundfile as sf
import srt
import webvtt

from conftest import REAL_TOKENIZER_DIR
from qtts.align.runtime import ENV_ALIGNER
from qtts.align.subtitles import CUE_CHARS, cues
from qtts.align.timing import WordTiming
from qtts.cli import main
from qtts.text.sentences import pack_sentences
from qtts.text.words import split_words
from qtts.tools.random_checkpoint import write_random_checkpoint

TEXT = "Hello there, this is the first sentence. And here comes the second one, a bit longer."
ARGS = ["--speaker", "ryan", "--max-frames", "12", "--seed", "1", "--threads", "1", "-q", "--no-watchdog"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def aligner_dir(tmp_path_factory):
    return write_random_checkpoint(str(tmp_path_factory.mktemp("al") / "tiny"), kind="forced_aligner",
                                   tokenizer_dir=REAL_TOKENIZER_DIR, seed=3)  # fmt: skip


@pytest.fixture(autouse=True)
def no_default_aligner(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_ALIGNER, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


def _say(snap, tmp_path, *extra):
    wav = tmp_path / "out.wav"
    assert main(["say", "-m", snap, "-o", str(wav), TEXT, *ARGS, *extra]) == 0
    return sf.info(str(wav)).duration


def test_srt_and_json_with_the_aligner(tiny_snapshot, aligner_dir, tmp_path):
    snap = tiny_snapshot(kind="custom_voice")
    sub, js = tmp_path / "out.srt", tmp_path / "words.json"
    duration = _say(snap, tmp_path, "--aligner", aligner_dir, "--subtitles", str(sub), "--words-json", str(js))
    data = json.loads(js.read_text(encoding="utf-8"))
    assert data["timestamps"] == "word"
    assert [w["text"] for w in data["words"]] == split_words(TEXT, "English")
    assert all(0 <= w["start"] <= w["end"] <= duration + 1e-3 for w in data["words"])
    parsed = list(srt.parse(sub.read_text(encoding="utf-8")))
    assert parsed and [c.index for c in parsed] == list(range(1, len(parsed) + 1))
    for a, b in zip(parsed, parsed[1:]):
        assert a.start < a.end <= b.start
    assert parsed[-1].end.total_seconds() <= duration + 1e-3
    spoken = " ".join(c.content for c in parsed)
    assert split_words(spoken, "English") == split_words(TEXT, "English")  # every word, in order, once
    assert "," in spoken and "." in spoken  # cue text comes from the text itself, punctuation kept


def test_vtt_without_an_aligner_times_each_piece(tiny_snapshot, tmp_path):
    snap = tiny_snapshot(kind="custom_voice")
    sub, wav = tmp_path / "out.vtt", tmp_path / "out.wav"
    text = " ".join([TEXT] * 3)  # over 200 characters: two sentence pieces
    assert main(["say", "-m", snap, "-o", str(wav), text, *ARGS, "--max-frames", "10", "--subtitles", str(sub)]) == 0
    duration = sf.info(str(wav)).duration
    captions = webvtt.read(str(sub)).captions
    assert [c.text for c in captions] == pack_sentences(text, 200) and len(captions) == 2
    assert captions[0].start == "00:00:00.000" and captions[0].end == captions[1].start
    assert _seconds(captions[-1].end) == pytest.approx(duration, abs=1e-3)


def _seconds(stamp: str) -> float:
    h, m, s = stamp.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


@pytest.mark.parametrize("flag,name,message", [("--subtitles", "x.txt", "use a .srt or .vtt"),
                                               ("--words-json", "x.txt", "ending in .json"),
                                               ("--subtitles", "missing/x.srt", "does not exist")])  # fmt: skip
def test_bad_timestamp_files_fail_before_the_model_loads(tmp_path, capsys, flag, name, message):
    code = main(["say", "-m", str(tmp_path / "no-model"), "-o", str(tmp_path / "o.wav"), "Hi.", flag,
                 str(tmp_path / name)])  # fmt: skip
    assert code != 0 and message in capsys.readouterr().err


def test_cues_follow_pieces_and_length():
    words = [WordTiming(f"w{i}", i * 0.5, i * 0.5 + 0.4, "word", 0 if i < 12 else 1) for i in range(20)]
    out = cues(words)
    assert all(len(c.text) <= CUE_CHARS for c in out)
    assert sum(len(c.text.split()) for c in out) == 20
    assert any(c.text.startswith("w12") for c in out)  # a new piece starts a new cue
    assert all(a.end <= b.start for a, b in zip(out, out[1:]))
    same = cues([WordTiming("a", 0.5, 1.0, "word", 0), WordTiming("b", 1.0, 1.0, "word", 1)])
    assert [(c.start, c.end, c.text) for c in same] == [(0.5, 1.0, "a b")]  # no time of its own: joins the cue before
    cjk = cues([WordTiming("你", 0, 0.1, "word", 0), WordTiming("好", 0.1, 0.2, "word", 0)], {0: "你好！"})
    assert [c.text for c in cjk] == ["你好！"]


def test_bench_timestamps_measures_the_aligner_and_both_streams(tiny_snapshot, aligner_dir, tmp_path, capsys):
    out = tmp_path / "ts.json"
    argv = ["bench", "-m", tiny_snapshot(kind="custom_voice"), "--plan", "torch", "--timestamps", "--aligner",
            aligner_dir, "--frames", "16", "--repeats", "1", "--threads", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())["timestamps"][0]
    assert [r["runtime"] for r in result["aligner"]] == ["onnx", "onnx-int8"]
    assert all(r["ms_per_audio_s"] > 0 for r in result["aligner"])
    off, on = result["stream"]["off"], result["stream"]["on"]
    assert off["words"] == 0 and on["words"] == len(split_words(" ".join(_bench_pieces()), "English"))
    assert off["audio_s"] == on["audio_s"] > 0  # the same frames either way
    assert "timestamps on" in capsys.readouterr().out


def test_bench_timestamps_without_an_aligner_says_how_to_get_one(tiny_snapshot, capsys):
    argv = ["bench", "-m", tiny_snapshot(kind="custom_voice"), "--plan", "torch", "--timestamps", "--frames", "8"]
    assert main(argv) == 2
    assert "needs a forced aligner: pass --aligner" in capsys.readouterr().err


def _bench_pieces():
    from qtts.tools.bench_timestamps import PIECE_CHARS, TEXT

    return pack_sentences(TEXT, PIECE_CHARS)
