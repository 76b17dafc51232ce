"""The unmodified ``openai`` package talks to qtts serve: streaming speech comes back as valid WAV."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
import soundfile as sf

import qtts
from server_util import start_server


@pytest.fixture(scope="module")
def server(tiny_snapshot):
    engine = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
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
        client.audio.speech.create(model="qtts", voice="vivian", input="hi", speed=1.25)
    assert "speed" in str(info.value)
    # the non-streaming helper reads the whole body; OpenAI's custom-voice form {"id": ...} works too
    audio = client.audio.speech.create(model="tts-1", voice={"id": "ryan"}, input="Whole body.",
                                       response_format="pcm")
    assert len(audio.content) == 8 * 3840
    sf.read(io.BytesIO(client.audio.speech.create(model="x", voice="ryan", input="Flac.",
                                                  response_format="flac").content))
