"""Word timestamps on the server (issue 41): ``timestamps: true`` on POST /v1/audio/speech as SSE word
events and as the JSON form, the live WebSocket's ``words`` events, and piece-level times without an
aligner; a tiny CustomVoice checkpoint and a tiny random aligner on a real uvicorn.

Random weights give arbitrary word times: the tests check the mechanism (the server's words are the
library's words for the same request, they come after their audio, the audio is the same with
timestamps on, each response says whether it times words or pieces).
"""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import qtts
from qtts.options import SynthesisOptions
from qtts.server.routes.speech_words import heard, shifted
from qtts.text.words import split_words
from support.server_util import assert_error, start_server
from support.timestamps_util import PIECE_FRAMES, TEXT, ShortPieces, no_official_aligner, tiny_aligner

BODY = {"model": "qtts", "input": TEXT, "voice": "vivian", "response_format": "pcm", "seed": 1}


@pytest.fixture(scope="module")
def cv(tiny_snapshot):
    return tiny_snapshot(kind="custom_voice")


@pytest.fixture(scope="module")
def word_server(cv, tmp_path_factory):
    """A server whose engine times words with the tiny aligner."""
    tts = qtts.load(cv, threads=1, aligner=tiny_aligner(tmp_path_factory.mktemp("aligner")))
    srv, _ = start_server(ShortPieces(tts), max_frames=100, ws_utterance_gap_s=0.3)
    srv.tts = tts
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def piece_server(cv, tmp_path_factory):
    """A server with no aligner anywhere: every piece is timed as a whole."""
    with no_official_aligner(tmp_path_factory.mktemp("no-aligner")):
        tts = qtts.load(cv, threads=1)
        srv, _ = start_server(ShortPieces(tts), max_frames=100)
        srv.tts = tts
        yield srv
        srv.stop()


def library_words(tts, **options) -> tuple[np.ndarray, list[dict]]:
    """The audio (int16) and words of the same request through the Python API."""
    opts = ShortPieces.options(SynthesisOptions(seed=1, timestamps=True, **options))
    audio = tts.synthesize(TEXT, speaker="vivian", options=opts)
    return np.round(np.clip(audio.samples, -1, 1) * 32767).astype("<i2"), [w.to_dict() for w in audio.words]


def sse_events(url: str, **body) -> tuple[httpx.Response, list[dict]]:
    r = httpx.post(url + "/v1/audio/speech", json={**BODY, "stream_format": "sse", **body}, timeout=120)
    assert r.status_code == 200, r.text
    events = [json.loads(block[len("data: "):]) for block in r.text.split("\n\n") if block]
    return r, events


def test_sse_word_events_follow_their_audio(word_server):
    r, events = sse_events(word_server.url, timestamps=True)
    assert r.headers["x-qtts-timestamps"] == "word"
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["timestamps"] == "word"
    heard_s, words, audio = 0.0, [], b""
    for e in events[:-1]:
        assert e["type"] in ("speech.audio.delta", "speech.words"), e
        if e["type"] == "speech.audio.delta":
            assert e["audio"], "an empty audio delta"
            audio += base64.b64decode(e["audio"])
            heard_s = len(audio) / 2 / 24000
        else:
            assert e["words"] and all(w["end"] <= heard_s + 1e-3 for w in e["words"]), (e, heard_s)
            words += e["words"]
    want_audio, want_words = library_words(word_server.tts)
    assert words == want_words and all(w["unit"] == "word" for w in words)
    assert [w["text"] for w in words] == split_words(TEXT, "English")
    assert sorted({w["piece"] for w in words}) == [0, 1, 2, 3]
    # words arrive between audio events, not all at the end
    kinds = [e["type"] for e in events]
    assert kinds.index("speech.words") < len(kinds) - 1 - kinds[::-1].index("speech.audio.delta")
    np.testing.assert_array_equal(np.frombuffer(audio, "<i2"), want_audio)
    plain_r, plain = sse_events(word_server.url)
    assert "x-qtts-timestamps" not in plain_r.headers and "timestamps" not in plain[-1]
    assert b"".join(base64.b64decode(e["audio"]) for e in plain[:-1]) == audio  # the same audio
    assert {e["type"] for e in plain} == {"speech.audio.delta", "speech.audio.done"}


@pytest.mark.parametrize("stream_format", [None, "audio"])
def test_json_form_has_the_file_and_its_words(word_server, stream_format):
    body = {**BODY, "timestamps": True, **({"stream_format": stream_format} if stream_format else {})}
    r = httpx.post(word_server.url + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    assert r.headers["x-qtts-timestamps"] == "word"
    got = r.json()
    want_audio, want_words = library_words(word_server.tts)
    assert got["audio_format"] == "pcm" and got["timestamps"] == "word" and got["sample_rate"] == 24000
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(got["audio"]), "<i2"), want_audio)
    assert got["words"] == want_words
    assert got["audio_seconds"] == pytest.approx(4 * PIECE_FRAMES / 12.5)
    assert got["usage"]["output_tokens"] == 4 * PIECE_FRAMES and got["usage"]["input_tokens"] > 0


def test_frame_cap_keeps_only_words_of_the_audio_sent(word_server):
    """max_frames 30 of 48: pieces 0 and 1 were heard whole (their words come, even those whose
    alignment finishes after the cut), piece 2 was cut: only its words that end in the audio sent
    (when its frames were generated ahead before the cut), the audio stops at 30 frames."""
    r = httpx.post(word_server.url + "/v1/audio/speech", json={**BODY, "timestamps": True, "max_frames": 30},
                   timeout=120)  # fmt: skip
    got = r.json()
    assert len(base64.b64decode(got["audio"])) == 30 * 1920 * 2 and got["finish_reason"] == "length"
    _, want = library_words(word_server.tts)
    whole = [w for w in want if w["piece"] < 2]
    assert got["words"][: len(whole)] == whole
    assert all(w in want and w["piece"] == 2 and w["end"] <= 30 / 12.5 for w in got["words"][len(whole):])


def test_health_models_and_page_info_say_word_or_piece(word_server, piece_server):
    for srv, level in ((word_server, "word"), (piece_server, "piece")):
        assert httpx.get(srv.url + "/health").json()["model"]["timestamps"] == level
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["timestamps"] == level
        assert httpx.get(srv.url + "/ui/info").json()["timestamps"] == level


def test_without_an_aligner_each_piece_is_timed_whole(piece_server):
    r, events = sse_events(piece_server.url, timestamps=True)
    assert r.headers["x-qtts-timestamps"] == "piece" and events[-1]["timestamps"] == "piece"
    words = [w for e in events if e["type"] == "speech.words" for w in e["words"]]
    pieces = piece_server.tts.synth.pieces(TEXT, ShortPieces.options(SynthesisOptions()))
    step = PIECE_FRAMES / 12.5
    assert words == [{"text": p, "start": round(i * step, 3), "end": round((i + 1) * step, 3), "unit": "piece",
                      "piece": i} for i, p in enumerate(pieces)]  # fmt: skip
    got = httpx.post(piece_server.url + "/v1/audio/speech", json={**BODY, "timestamps": True}, timeout=120).json()
    assert got["timestamps"] == "piece" and got["words"] == words


@pytest.mark.parametrize("value", ["yes", 1, "true", None, [True]])
def test_timestamps_must_be_a_boolean(word_server, value):
    r = httpx.post(word_server.url + "/v1/audio/speech", json={**BODY, "timestamps": value}, timeout=30)
    if value is None:  # null = the default (off)
        assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
        return
    err = assert_error(r, 400, "timestamps")
    assert err["param"] == "timestamps"


def ws_session(url: str, session: dict, deltas: list[str], pause: float = 0.0) -> list[tuple[str, object]]:
    """A live session: ("audio", bytes) and ("event", dict) in the order they arrived."""
    import time

    out: list[tuple[str, object]] = []
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", max_size=None) as ws:
        try:  # (a server that refuses the session closes it; what it sent is read below)
            ws.send(json.dumps({"type": "session.update", "session": session}))
            for delta in deltas:
                ws.send(json.dumps({"type": "text.delta", "delta": delta}))
                time.sleep(pause)  # (a pause longer than the utterance gap ends an utterance)
            ws.send(json.dumps({"type": "text.done"}))
        except ConnectionClosed:
            pass
        try:
            while True:
                msg = ws.recv(timeout=120)
                out.append(("audio", msg) if isinstance(msg, bytes) else ("event", json.loads(msg)))
        except ConnectionClosed:
            pass
    return out


LIVE = {"voice": "vivian", "response_format": "pcm", "greedy": True, "timestamps": True}


def _live_words(items) -> tuple[list[dict], float]:
    """The words of a session, checked to come after their audio; and the audio's seconds."""
    heard_s, words = 0.0, []
    for kind, value in items:
        if kind == "audio":
            heard_s += len(value) / 2 / 24000
        elif value["type"] == "words":
            assert all(w["end"] <= heard_s + 1e-3 for w in value["words"]), (value, heard_s)
            words += value["words"]
    return words, heard_s


def test_websocket_words_between_audio_frames(word_server):
    text = "Hello there, this is live speech."
    items = ws_session(word_server.url, {**LIVE, "max_frames": 16}, [text])
    events = [v for k, v in items if k == "event"]
    assert events[0] == {"type": "audio.started", "response_format": "pcm", "sample_rate": 24000,
                         "timestamps": "word"}  # fmt: skip
    assert events[-1]["type"] == "audio.done" and events[-2]["type"] == "words"
    words, seconds = _live_words(items)
    assert seconds == pytest.approx(16 / 12.5)  # the session cap cut the last chunk; its words still came
    opts = SynthesisOptions(max_frames=16, greedy=True, timestamps=True)
    want = [w.to_dict() for c in word_server.tts.stream_text([text], speaker="vivian", options=opts) for w in c.words]
    assert words == want and [w["text"] for w in words] == split_words(text, "English")


def test_websocket_second_utterance_is_timed_from_the_session_start(word_server):
    items = ws_session(word_server.url, LIVE, ["First one here. ", "Then the second."], pause=1.0)
    words, seconds = _live_words(items)
    assert [w["text"] for w in words] == ["First", "one", "here", "Then", "the", "second"]
    first, second = [w for w in words if w["piece"] == 0], [w for w in words if w["piece"] == 1]
    assert len(first) == 3 and len(second) == 3  # two utterances, one talker context each
    assert events_of(items, "audio.done")["stats"]["utterances"] == 2
    # the second utterance's words lie in its own audio, after the first's
    assert min(w["start"] for w in second) >= max(w["end"] for w in first) - 1e-3
    assert max(w["end"] for w in second) <= seconds + 1e-3


def events_of(items, kind: str) -> dict:
    return next(v for k, v in items if k == "event" and v["type"] == kind)


def test_websocket_timestamps_must_be_a_boolean(word_server):
    items = ws_session(word_server.url, {**LIVE, "timestamps": "on"}, ["Hi."])
    error = events_of(items, "error")["error"]
    assert error["code"] == "invalid_session" and "timestamps" in error["message"]


def test_heard_and_shifted():
    from qtts.align.timing import WordTiming

    words = [WordTiming("a", 0.0, 0.4, "word", 0), WordTiming("b", 0.4, 0.9, "word", 0)]
    assert [w["text"] for w in heard(words, 0.5)] == ["a"]
    assert heard(words, 0.9) == [w.to_dict() for w in words]
    moved = shifted(heard(words, 1.0), 1.25, 3)
    assert [(w["start"], w["end"], w["piece"]) for w in moved] == [(1.25, 1.65, 3), (1.65, 2.15, 3)]


def _served(args_tail: list[str]):
    from qtts.cli.main import build_parser
    from qtts.cli.serve import _load_engines
    from qtts.server.app import ServerState
    from qtts.server.settings import ServerSettings

    state = ServerState(ServerSettings())
    _load_engines(build_parser().parse_args(["serve", *args_tail, "--threads", "1"]), state)
    return state


def test_serve_aligner_is_loaded_before_ready(cv, tmp_path):
    with no_official_aligner(tmp_path):
        state = _served(["-m", cv, "--aligner", tiny_aligner(tmp_path)])
        assert state.ready and state.timestamps == "word" and state.model_info()["timestamps"] == "word"
        state.shutdown()
        plain = _served(["-m", cv])
        assert plain.ready and plain.timestamps == "piece"
        plain.shutdown()


def test_serve_aligner_that_cannot_load_is_a_load_error(cv, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    state = _served(["-m", cv, "--aligner", str(broken)])
    assert not state.ready and state.load_error, state.load_error


def test_serve_refuses_an_aligner_folder_without_a_snapshot(tmp_path):
    from qtts.cli.serve import check_aligner
    from qtts.errors import InputError

    for bad in (tmp_path / "missing", tmp_path):
        with pytest.raises(InputError, match="no Qwen3-ForcedAligner snapshot there"):
            check_aligner(str(bad))
    check_aligner(None)
    check_aligner("Qwen/Qwen3-ForcedAligner-0.6B")  # a hub id: resolved by the loader


def test_a_found_aligner_that_cannot_load_leaves_the_server_serving(cv, tmp_path, monkeypatch, caplog):
    """$QTTS_ALIGNER names a broken snapshot and no --aligner was given: the server serves speech,
    logs why word timestamps are off, says "piece", and a request or session with timestamps gets 503
    and the reason."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    monkeypatch.setenv("QTTS_ALIGNER", str(broken))
    with caplog.at_level("WARNING", logger="qtts.server.routes.speech_words"):
        srv, _ = start_server(qtts.load(cv, threads=1), max_frames=4)
    try:
        assert "cannot be loaded" in caplog.text
        assert httpx.get(srv.url + "/health").json()["model"]["timestamps"] == "piece"
        assert httpx.post(srv.url + "/v1/audio/speech", json=BODY, timeout=60).status_code == 200
        r = httpx.post(srv.url + "/v1/audio/speech", json={**BODY, "timestamps": True}, timeout=60)
        err = assert_error(r, 503, "word timestamps are unavailable", "thinker_config")
        assert err["code"] == "timestamps_unavailable" and err["param"] == "timestamps"
        items = ws_session(srv.url, LIVE, ["Hi."])
        error = events_of(items, "error")["error"]
        assert error["code"] == "timestamps_unavailable" and "thinker_config" in error["message"]
    finally:
        srv.stop()
