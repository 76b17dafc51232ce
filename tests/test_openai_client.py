"""The unmodified ``openai`` package talks to qtts serve: streaming speech comes back as valid WAV."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
import soundfile as sf

import qtts
from qtts.audio.chunk import float_to_int16
from qtts.audio.stretch import stretch
from server_util import start_server


@pytest.fixture(scope="module")
def engine(tiny_snapshot):
    return qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)


@pytest.fixture(scope="module")
def server(engine):
    srv, app = start_server(engine, max_frames=8)
    yield srv
    srv.stop()


def test_openai_streaming_response_is_valid_wav(server, tmp_path):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    out = tmp_path / "speech.wav"
    with client.audio.speech.with_streaming_response.create(
        model="qtts", voice="vivian", input="Hello from the OpenAI client.", response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        response.stream_to_file(out)
    samples, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and samples.ndim == 1
    assert len(samples) == 8 * 1920 and np.isfinite(samples).all() and np.abs(samples).max() > 0


def test_openai_errors_surface_as_exceptions(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model="qtts", voice="alloy", input="hi")
    assert "unknown voice" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="qtts", voice="vivian", input="hi", speed=4.5)
    assert "speed" in str(info.value)
    # the non-streaming helper reads the whole body; OpenAI's custom-voice form {"id": ...} works too
    audio = client.audio.speech.create(model="tts-1", voice={"id": "ryan"}, input="Whole body.",
                                       response_format="pcm")
    assert len(audio.content) == 8 * 3840
    sf.read(io.BytesIO(client.audio.speech.create(model="x", voice="ryan", input="Flac.",
                                                  response_format="flac").content))


@pytest.mark.parametrize("speed", [0.5, 1.25, 4.0])
def test_openai_speed_stretches_the_audio(server, engine, speed):
    """``speed`` from the unmodified client: the response equals the same seeded synthesis at
    speed 1 stretched offline by the same stretcher (the server stretches while streaming)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    extra = {"seed": 5, "max_frames": 8}
    fast = client.audio.speech.create(model="qtts", voice="vivian", input="Speed test.", response_format="pcm",
                                      speed=speed, extra_body=extra).content
    plain = engine.synthesize("Speed test.", speaker="vivian", options=qtts.SynthesisOptions(**extra)).samples
    assert len(plain) > 0 and len(plain) % 1920 == 0
    got = np.frombuffer(fast, dtype="<i2")
    assert len(got) == int(np.floor(len(plain) / speed + 0.5))
    assert np.array_equal(got, float_to_int16(stretch(plain, speed)))


def test_openai_client_lists_voices_at_the_audio_alias(server):
    """GET /v1/audio/voices answers like /v1/voices; the client reaches it with its generic get()."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    alias = client.get("/audio/voices", cast_to=object)
    plain = client.get("/voices", cast_to=object)
    assert alias == plain
    ids = [v["id"] for v in alias["data"]]
    assert "vivian" in ids and [v["id"] for v in alias["voices"]] == ids
    assert all(v["type"] == "speaker" for v in alias["data"])
