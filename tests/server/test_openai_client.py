"""The unmodified ``openai`` package talks to qtts serve: streaming speech comes back as valid WAV,
a request that names no format gets MP3 (as from OpenAI), OpenAI's voice names map to voices."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
import soundfile as sf

import qtts
from qtts.audio.stretch import stretch
from qtts.audio.writers import float_to_int16
from support.server_util import start_server


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
        client.audio.speech.create(model="qtts", voice="nobody", input="hi")
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


def _is_mp3(data: bytes) -> bool:
    """An MPEG audio frame sync (11 set bits) or an ID3 tag at the start."""
    return data[:3] == b"ID3" or (len(data) > 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


def test_openai_default_format_is_mp3_and_streams(server, tmp_path):
    """``write_to_file("x.mp3")`` with no response_format writes an MP3, as with OpenAI; the body
    arrives in several chunks while it is generated (constant-bitrate frames)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    out = tmp_path / "x.mp3"
    client.audio.speech.create(model="tts-1", voice="alloy", input="Hello in mp3.").write_to_file(out)
    data = out.read_bytes()
    assert _is_mp3(data) and not data.startswith(b"RIFF"), data[:16]
    info = sf.info(str(out))
    assert info.format == "MP3" and info.samplerate == 24000 and info.channels == 1
    samples, _ = sf.read(out, dtype="float32")
    assert abs(len(samples) - 8 * 1920) < 3000 and np.isfinite(samples).all()  # 8 frames, codec delay
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="nova", input="Streamed.") as r:
        assert r.headers["content-type"] == "audio/mpeg"
        chunks = [c for c in r.iter_bytes(64) if c]
    assert _is_mp3(b"".join(chunks)) and len(chunks) > 3


def test_openai_voice_names_map_to_speakers(server):
    """The default alias table: alloy is vivian and onyx is uncle_fu on a CustomVoice checkpoint
    (the same seeded audio), and GET /v1/voices shows the table."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    extra = {"seed": 3}

    def pcm(voice: str) -> bytes:
        return client.audio.speech.create(model="qtts", voice=voice, input="Alias.", response_format="pcm",
                                          extra_body=extra).content

    assert pcm("alloy") == pcm("vivian") and pcm("ONYX") == pcm("uncle_fu")
    assert pcm("alloy") != pcm("onyx")
    aliases = client.get("/voices", cast_to=object)["aliases"]
    assert aliases["alloy"] == "vivian" and aliases["onyx"] == "uncle_fu" and set(aliases) >= {"nova", "shimmer"}


def test_voice_alias_flag_overrides_the_table(engine):
    srv, _ = start_server(engine, max_frames=4, voice_aliases=(("alloy", "ryan"), ("narrator", "serena")))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="not-needed", max_retries=0)

        def pcm(voice: str) -> bytes:
            return client.audio.speech.create(model="qtts", voice=voice, input="Flag.", response_format="pcm",
                                              extra_body={"seed": 4}).content

        assert pcm("alloy") == pcm("ryan") and pcm("narrator") == pcm("serena") and pcm("nova") == pcm("vivian")
        assert client.get("/voices", cast_to=object)["aliases"]["alloy"] == "ryan"
    finally:
        srv.stop()
    srv, _ = start_server(engine, max_frames=4, voice_aliases=(("alloy", "nobody"),))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="not-needed", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.speech.create(model="qtts", voice="alloy", input="hi")
        assert "'nobody'" in str(info.value) and "vivian" in str(info.value)
    finally:
        srv.stop()


def test_unmapped_openai_voice_is_a_400_listing_the_choices(tiny_snapshot):
    """A Base checkpoint has no speakers: alloy is not mapped, and the 400 says what exists and
    how to map it; an unknown request field is refused (400) as OpenAI refuses it."""
    base = qtts.load(tiny_snapshot(kind="base"), threads=1)
    srv, _ = start_server(base, max_frames=4)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="not-needed", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.speech.create(model="qtts", voice="alloy", input="hi")
        text = str(info.value)
        assert "'alloy'" in text and "no voices yet" in text and "--voice-alias alloy=VOICE" in text
        assert info.value.body["code"] == "voice_not_mapped" and info.value.body["param"] == "voice"
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.speech.create(model="qtts", voice="alloy", input="hi", extra_body={"colour": "red"})
        assert "unknown field 'colour'" in str(info.value)
    finally:
        srv.stop()
