"""The Wyoming server, driven by the ``wyoming`` library's own client over loopback TCP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

import qtts
from conftest import REPO_ROOT
from qtts.errors import InputError
from qtts.wyoming import WyomingService, WyomingSettings
from qtts.wyoming.catalog import Catalog
from qtts.wyoming.handler import complete_sentences

FRAMES = 6  # per sentence: short audio keeps the tests quick on random weights
SEED = 11


@pytest.fixture(scope="module")
def cv_engine(tiny_snapshot):
    return qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)


class Watched:
    """A TTS whose stream() reports the frames it produced and when it was closed; ``cap``
    overrides the frame budget of the next calls."""

    def __init__(self, engine):
        self.engine = engine
        self.frames = 0
        self.closed = threading.Event()
        self.cap = None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, *args, options=None, **kwargs):
        self.closed.clear()
        self.frames = 0
        if self.cap is not None:
            options = dataclasses.replace(options, max_frames=self.cap)
        inner = self.engine.stream(*args, options=options, **kwargs)
        try:
            for chunk in inner:
                self.frames = chunk.frame_start + chunk.num_frames
                yield chunk
        finally:
            inner.close()
            self.closed.set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def serving(engine, **settings):
    """A running service on a free loopback port; yields (uri, service)."""
    service = WyomingService(engine, WyomingSettings(**{"seed": SEED, "max_frames": FRAMES, **settings}))
    uri = f"tcp://127.0.0.1:{free_port()}"
    server = await service.start(uri)
    try:
        yield uri, service
    finally:
        await server.stop()


def client(uri: str) -> AsyncTcpClient:
    return AsyncTcpClient.from_uri(uri, connect_timeout=10, read_timeout=120)


async def events_until(c, *last: str) -> list:
    """Read events until one of type ``last`` (included) or the end of the connection."""
    out = []
    while True:
        event = await c.read_event()
        if event is None:
            return out
        out.append(event)
        if event.type in last:
            return out


def audio_of(events) -> np.ndarray:
    data = b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))
    return np.frombuffer(data, dtype="<i2")


def offline(engine, text, **kwargs) -> np.ndarray:
    options = qtts.SynthesisOptions(seed=SEED, max_frames=FRAMES, language=kwargs.pop("language", None))
    samples = engine.synthesize(text, options=options, **kwargs).samples
    return qtts.audio.float_to_int16(samples)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def test_describe_lists_program_voices_and_languages(cv_engine):
    async def scenario():
        async with serving(cv_engine) as (uri, _), client(uri) as c:
            await c.write_event(Describe().event())
            return Info.from_event((await events_until(c, "info"))[-1])

    info = run(scenario())
    (program,) = info.tts
    assert program.name == "qtts" and program.installed and program.supports_synthesize_streaming
    assert "custom_voice" in program.description
    assert [v.name for v in program.voices] == sorted(cv_engine.speakers)
    langs = program.voices[0].languages
    assert {"en", "zh", "de", "fr", "ja", "ko", "ru", "es", "it", "pt"} == set(langs)


def test_synthesize_streams_the_chosen_voice(cv_engine):
    """audio-start, then one audio-chunk per engine chunk, then audio-stop; the audio is what
    the engine makes offline for that speaker and language (same seed)."""

    async def scenario():
        async with serving(cv_engine) as (uri, _):
            got = {}
            for key, voice in [("ryan", SynthesizeVoice(name="ryan")), ("vivian", SynthesizeVoice(name="Vivian")),
                               ("english", SynthesizeVoice(language="en_US"))]:
                async with client(uri) as c:
                    await c.write_event(Synthesize(text="Hello from Wyoming.", voice=voice).event())
                    got[key] = await events_until(c, "audio-stop")
            return got

    got = run(scenario())
    for events in got.values():
        types = [e.type for e in events]
        assert types[0] == "audio-start" and types[-1] == "audio-stop"
        assert set(types[1:-1]) == {"audio-chunk"} and len(types) >= 4  # first chunk 1 frame, then more
        start = AudioStart.from_event(events[0])
        assert (start.rate, start.width, start.channels) == (24000, 2, 1)
        assert len(AudioChunk.from_event(events[1]).audio) == 1 * 1920 * 2  # one frame of 16-bit PCM
    assert np.array_equal(audio_of(got["ryan"]), offline(cv_engine, "Hello from Wyoming.", speaker="ryan"))
    assert np.array_equal(audio_of(got["vivian"]), offline(cv_engine, "Hello from Wyoming.", speaker="vivian"))
    default = sorted(cv_engine.speakers)[0]
    assert np.array_equal(audio_of(got["english"]),
                          offline(cv_engine, "Hello from Wyoming.", speaker=default, language="english"))
    assert not np.array_equal(audio_of(got["ryan"]), audio_of(got["vivian"]))


def test_streaming_synthesis_speaks_each_sentence_as_it_completes(cv_engine):
    """synthesize-start / -chunk: audio of the first sentence arrives before synthesize-stop is
    sent; each sentence is audio-start .. audio-stop; synthesize-stopped comes last; the
    compatibility synthesize event inside the session is not spoken twice."""
    first, second = "This is the first sentence. ", "And this is the second one."

    async def scenario():
        async with serving(cv_engine) as (uri, service), client(uri) as c:
            await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name="ryan")).event())
            await c.write_event(SynthesizeChunk(text=first + "And this").event())
            early = await events_until(c, "audio-chunk")  # before the session ends
            await c.write_event(SynthesizeChunk(text=" is the second one.").event())
            await c.write_event(Synthesize(text=first + second, voice=SynthesizeVoice(name="ryan")).event())
            await c.write_event(SynthesizeStop().event())
            rest = await events_until(c, "synthesize-stopped")
            return early, rest, service.generations

    early, rest, generations = run(scenario())
    assert [e.type for e in early] == ["audio-start", "audio-chunk"]
    events = early + rest
    types = [e.type for e in events]
    assert types[-1] == SynthesizeStopped().event().type and types.count("audio-start") == 2
    assert types.count("audio-stop") == 2 and generations == 2
    cut = types.index("audio-stop") + 1
    assert np.array_equal(audio_of(events[:cut]), offline(cv_engine, first.strip(), speaker="ryan"))
    assert np.array_equal(audio_of(events[cut:]), offline(cv_engine, second, speaker="ryan"))


def test_bad_voice_and_language_get_an_error_event_then_close(cv_engine):
    async def scenario():
        out = []
        async with serving(cv_engine) as (uri, _):
            for voice in (SynthesizeVoice(name="alloy"), SynthesizeVoice(language="xx")):
                async with client(uri) as c:
                    await c.write_event(Synthesize(text="Hi there.", voice=voice).event())
                    out.append(await events_until(c))
            async with client(uri) as c:  # and in a streamed session, at synthesize-start
                await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event())
                out.append(await events_until(c))
        return out

    results = run(scenario())
    for events in results:
        assert [e.type for e in events] == ["error"]  # then the connection closed (no audio)
    errors = [Error.from_event(e[0]) for e in results]
    assert errors[0].code == "voice_not_found" and "alloy" in errors[0].text and "ryan" in errors[0].text
    assert errors[1].code == "invalid_request" and "language" in errors[1].text and "en" in errors[1].text
    assert errors[2].code == "voice_not_found"


def test_client_disconnect_stops_generation(cv_engine):
    """A client that leaves after the first audio chunk: the generation stops long before its
    budget, the engine is released, and the next client is served."""
    watched = Watched(cv_engine)

    async def scenario():
        async with serving(watched, max_frames=400) as (uri, service):
            async with client(uri) as c:
                await c.write_event(Synthesize(text="A long answer that would take a while. " * 3,
                                               voice=SynthesizeVoice(name="ryan")).event())
                await events_until(c, "audio-chunk")
            assert await asyncio.to_thread(watched.closed.wait, 60)
            stopped_at = watched.frames
            for _ in range(600):  # the engine is released once the worker thread has returned
                if not service.turns.busy:
                    break
                await asyncio.sleep(0.05)
            assert not service.turns.busy
            watched.cap = FRAMES
            async with client(uri) as c:
                await c.write_event(Synthesize(text="Still here.").event())
                after = await events_until(c, "audio-stop")
            return stopped_at, after

    stopped_at, after = run(scenario())
    assert 1 <= stopped_at < 40, stopped_at  # budget 400 frames per sentence; the first chunk is 1 frame
    assert [e.type for e in after][-1] == "audio-stop" and len(audio_of(after)) > 0


def test_base_checkpoint_offers_saved_voices(real_tts, tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(24000 * 2) / 24000
    ref = (0.3 * np.sin(2 * np.pi * 150 * t) + 0.02 * rng.standard_normal(len(t))).astype(np.float32)
    real_tts.create_voice(ref, sample_rate=24000, name="me").save(str(tmp_path / "me.voice"))
    (tmp_path / "not a voice.voice").write_bytes(b"x")  # not a valid id: not listed

    async def scenario():
        async with serving(real_tts, voices_dir=str(tmp_path)) as (uri, _), client(uri) as c:
            await c.write_event(Describe().event())
            info = Info.from_event((await events_until(c, "info"))[-1])
            await c.write_event(Synthesize(text="Cloned.", voice=SynthesizeVoice(name="me")).event())
            return info, await events_until(c, "audio-stop")

    info, events = run(scenario())
    assert [v.name for v in info.tts[0].voices] == ["me"]
    voice = qtts.Voice.load(str(tmp_path / "me.voice"))
    assert np.array_equal(audio_of(events), offline(real_tts, "Cloned.", voice=voice))
    with pytest.raises(InputError, match="qtts voice create"):
        Catalog(real_tts, voices_dir=None)


def test_catalog_languages_and_sentence_cutting(cv_engine):
    cat = Catalog(cv_engine)
    assert cat.model_language("en_US") == "english" and cat.model_language("zh-CN") == "chinese"
    assert cat.model_language("Sichuan_Dialect") == "sichuan_dialect" and cat.model_language(None) == "auto"
    with pytest.raises(InputError, match="unknown language"):
        cat.model_language("klingon")
    assert cat.resolve(None, speaker="eric").speaker == "eric"  # piper-style speaker field
    assert complete_sentences("Hello there, my friend. How are") == (["Hello there, my friend."], "How are")
    assert complete_sentences("No end yet ") == ([], "No end yet ")
    done, rest = complete_sentences("First one is done here. Second ")
    assert done == ["First one is done here."] and rest == "Second "  # the space before more text stays


def test_qtts_wyoming_command(tiny_snapshot, capsys):
    """``qtts wyoming`` in a subprocess: prints where it listens, answers describe and synthesize,
    stops on SIGTERM; bad flags exit 2 before loading anything."""
    import signal
    import subprocess
    import sys

    from qtts.cli import main

    port = free_port()
    cmd = [sys.executable, "-m", "qtts", "wyoming", "-m", tiny_snapshot(kind="custom_voice"), "--threads", "1",
           "--uri", f"tcp://127.0.0.1:{port}", "--voice", "ryan", "--seed", "1", "--max-frames", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the model is loaded, before listening
        assert f"Wyoming service on tcp://127.0.0.1:{port}" in line and "ryan" in line, line

        async def scenario():
            for _ in range(200):
                try:
                    async with client(f"tcp://127.0.0.1:{port}") as c:
                        await c.write_event(Describe().event())
                        info = Info.from_event((await events_until(c, "info"))[-1])
                        await c.write_event(Synthesize(text="Hi there.").event())
                        return info, await events_until(c, "audio-stop")
                except ConnectionRefusedError:
                    await asyncio.sleep(0.05)
            raise AssertionError("the service never listened")

        info, events = run(scenario())
        assert "ryan" in [v.name for v in info.tts[0].voices]
        assert len(audio_of(events)) == 4 * 1920
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    for bad in (["--uri", "http://x:1"], ["--uri", "tcp://127.0.0.1"], ["--speed", "9"]):
        assert main(["wyoming", "-m", "M", *bad]) == 2
        assert "error" in capsys.readouterr().err


def test_wyoming_client_example(cv_engine, tmp_path):
    """examples/wyoming_client.py against a running service writes the streamed audio as WAV."""
    import os
    import subprocess
    import sys

    import soundfile as sf

    example = os.path.join(REPO_ROOT, "examples",
                           "wyoming_client.py")
    out = tmp_path / "hello.wav"

    async def scenario():
        async with serving(cv_engine) as (uri, _):
            proc = await asyncio.create_subprocess_exec(sys.executable, example, "Hello from Wyoming.", "--uri", uri,
                                                        "--voice", "ryan", "-o", str(out),
                                                        stderr=subprocess.PIPE)
            _, err = await proc.communicate()
            return proc.returncode, err.decode()

    rc, err = run(scenario())
    assert rc == 0, err[-2000:]
    samples, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and np.array_equal(samples, offline(cv_engine, "Hello from Wyoming.", speaker="ryan"))
