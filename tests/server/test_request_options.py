"""One mapping from a speech request to options and its frame cap (qtts.engine.request), whichever
surface the request came through: POST /v1/audio/speech, the live WebSocket's session.update,
Wyoming's settings and ``qtts say``'s flags. Each surface's own code is called, not a copy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qtts.audio import AudioChunk
from qtts.cli.main import build_parser
from qtts.cli.say import build_options
from qtts.engine.request import Caps, FrameCap, SpeechFields, count_tokens, frame_cap, to_options, with_cancel
from qtts.errors import InputError
from qtts.server.errors import ApiError
from qtts.server.jobs import caps
from qtts.server.routes.speech import SpeechRequest, _check_request, options_of
from qtts.server.routes.speech_stream import SessionConfig, session_options
from qtts.server.settings import ServerSettings
from qtts.wyoming.service import WyomingService, WyomingSettings

ASKED = {"temperature": 0.7, "top_k": 30, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 7, "greedy": False,
         "speed": 1.25, "max_frames": 40}


def _cli(extra: list[str] = ()):
    args = build_parser().parse_args(["say", "hello", "-m", "M", "-o", "x.wav", "--temperature", "0.7", "--top-k", "30",
                                      "--top-p", "0.9", "--repetition-penalty", "1.1", "--seed", "7",
                                      "--speed", "1.25", "--max-frames", "40", *extra])
    return build_options(args)


def test_http_websocket_and_cli_map_the_same_request_to_the_same_options():
    settings = ServerSettings(chunk_frames=0)
    http = options_of(SpeechRequest(input="hello", **ASKED), settings)
    live = session_options(SessionConfig(**ASKED), settings)
    cli = _cli()
    expected = to_options(SpeechFields(**ASKED))
    assert http == live == expected
    # the CLI adds its own flags (sentence split, watchdog, chunk sizes); every request field is the same
    for name in ("talker", "seed", "greedy", "max_frames", "speed", "timestamps"):
        assert getattr(cli, name) == getattr(expected, name), name


def test_wyoming_maps_its_settings_as_the_others_map_a_request():
    # (a whole service needs an engine for its catalog: its own options() runs on its settings alone)
    holder = type("Service", (), {"settings": WyomingSettings(speed=1.5, seed=3, max_frames=90)})()
    wyoming = WyomingService.options(holder)
    http = options_of(SpeechRequest(input="hi", speed=1.5, seed=3, max_frames=90), ServerSettings(chunk_frames=0))
    assert wyoming == http == to_options(SpeechFields(speed=1.5, seed=3, max_frames=90))


def test_the_server_chunk_size_reaches_http_and_websocket_alike():
    settings = ServerSettings(chunk_frames=4)
    http = options_of(SpeechRequest(input="hello"), settings)
    live = session_options(SessionConfig(), settings)
    assert http.chunk_frames == live.chunk_frames == 4


def test_every_surface_refuses_a_frame_budget_over_the_server_limit_with_one_message():
    settings = ServerSettings(max_frames=100)
    with pytest.raises(ApiError) as http:
        _check_request(SpeechRequest(input="hello", max_frames=101), settings)
    with pytest.raises(InputError) as live:
        session_options(SessionConfig(max_frames=101), settings)
    assert http.value.message == str(live.value) == "max_frames=101 exceeds this server's limit of 100"
    assert (http.value.code, http.value.param) == ("max_frames_too_large", "max_frames")


def test_the_frame_cap_is_the_request_budget_else_the_server_limit():
    limit = Caps(max_frames=100)
    assert frame_cap(SpeechFields(max_frames=30), limit) == 30
    assert frame_cap(SpeechFields(), limit) == 100
    assert frame_cap(SpeechFields.of(SpeechRequest(input="x")), caps(ServerSettings(max_frames=55))) == 55


def _chunk(frames: int, final: bool = False) -> AudioChunk:
    return AudioChunk(samples=np.ones(frames * 1920, dtype=np.float32), sample_rate=24000, num_frames=frames,
                      is_final=final)


def test_frame_cap_cuts_the_chunk_that_crosses_it_and_counts_every_frame():
    cap = FrameCap(10)
    sizes = []
    for chunk in (_chunk(4), _chunk(4), _chunk(4), _chunk(4)):
        samples, n, capped = cap.take(chunk)
        sizes.append((len(samples) // 1920, n, capped))
        assert len(samples) == n * 1920
    assert sizes == [(4, 4, False), (4, 4, False), (2, 2, True), (0, 0, True)]
    assert cap.frames == 10 and cap.full


def test_a_final_chunk_that_fills_the_cap_is_not_a_cut():
    cap = FrameCap(8, frames=4)
    _, n, capped = cap.take(_chunk(4, final=True))
    assert (n, capped, cap.full) == (4, False, True)


def test_fields_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SpeechFields().seed = 1


def test_frame_cap_over_a_stream_is_take_per_chunk():
    chunks = [_chunk(4), _chunk(4), _chunk(4, final=True)]
    got = [(n, capped) for _, _, n, capped in FrameCap(6).over(chunks)]
    assert got == [(4, False), (2, True), (0, False)]  # (the final chunk is never a cut)


def test_with_cancel_reaches_options_that_take_one_and_count_tokens_needs_a_tokenizer():
    event = object()
    assert with_cancel(to_options(SpeechFields()), event).cancel is event
    assert with_cancel(None, event) is None
    assert count_tokens(None, "hello") == 0
    assert count_tokens(type("T", (), {"encode": staticmethod(lambda text: text.split())})(), "a b c") == 3
