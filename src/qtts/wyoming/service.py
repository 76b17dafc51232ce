"""The Wyoming service: settings, the engine taken in turns, audio streamed from a worker thread.

One engine serves one generation at a time. A request is spoken piece by piece (the engine's own
sentence pieces, :data:`qtts.options.SynthesisOptions.max_sentence_chars` characters at most), and
each piece takes the engine in turn: when a piece ends and other connections wait, the engine goes
to the one whose client address holds it least and used it least lately (the HTTP queue's fair
share, :class:`qtts.server.shares.Turns`), so one long request delays another client by at most
one piece. A request stops at ``max_request_frames`` in all (the HTTP server's default cap).
Generation runs on a worker thread and hands each :class:`qtts.audio.AudioChunk` to the event loop
as soon as the engine yields it; when the consumer stops (the client left, or the connection
failed) the worker's cancel event is set, generation stops within one frame, and the engine is
given back only after the worker returned. The engine is never held while a connection waits for
its client to read: audio generated faster than the client reads waits in that connection's queue
(one piece at most), and a client that reads nothing for ``write_timeout_s`` is dropped
(:mod:`qtts.wyoming.handler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from ..engine.request import FrameCap, SpeechFields, to_options
from ..errors import InputError
from ..server.clients import LOCAL
from ..server.shares import Turns
from .catalog import Catalog, Choice

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WyomingSettings:
    #: where to listen: tcp://HOST:PORT (loopback by default: Home Assistant on the same machine),
    #: unix://PATH or stdio://
    uri: str = "tcp://127.0.0.1:10200"
    #: directory of saved ``.voice`` files (Base checkpoints: the voices clients can pick)
    voices_dir: str | None = None
    #: voice used when a request names none (default: the first in the catalog)
    voice: str | None = None
    #: language when a request names none: 'auto' lets the model infer it from the text
    language: str = "auto"
    #: style instruction for every request (VoiceDesign needs one; 1.7B CustomVoice may take one)
    instruct: str | None = None
    #: speaking rate for every request (pitch-preserving time stretch; 1.0 = unchanged)
    speed: float = 1.0
    #: seeds sampling, so the same text and voice always sound the same (None: fresh each time)
    seed: int | None = None
    #: frame budget per sentence (12.5 frames/s); None = from the text length (the runaway guard)
    max_frames: int | None = None
    #: frames of one synthesize request (or one streamed sentence) in all; the HTTP server's
    #: default cap (``qtts serve --max-frames``): 164 s of audio
    max_request_frames: int = 2048
    #: longest text of one synthesize request (or one streamed session), in characters
    max_chars: int = 4096
    #: answer synthesize-start/-chunk/-stop (sentences are spoken as soon as they are complete)
    streaming: bool = True
    #: open client connections at most; one more gets an error event and is closed
    max_connections: int = 16
    #: open connections from one client address (the TCP peer) at most; one more gets
    #: ``too_many_connections``, so one address cannot take every connection
    max_connections_per_client: int = 8
    #: a connection that sends no event for this long while nothing is being spoken is closed
    idle_timeout_s: float = 60.0
    #: a client that reads nothing of what is sent for this long is dropped
    write_timeout_s: float = 10.0

    def __post_init__(self):
        from ..options import SynthesisOptions

        SynthesisOptions(speed=self.speed, seed=self.seed, max_frames=self.max_frames).validate()
        if self.max_chars < 1:
            raise InputError(f"max_chars={self.max_chars}: must be >= 1")
        for name in ("max_connections", "max_connections_per_client", "max_request_frames"):
            if getattr(self, name) < 1:
                raise InputError(f"{name}={getattr(self, name)}: must be >= 1")
        for name in ("idle_timeout_s", "write_timeout_s"):
            if not 0 < getattr(self, name) <= 86400:
                raise InputError(f"{name}={getattr(self, name)}: must be in (0, 86400] seconds")


class WyomingService:
    """The shared state of every connection: engine, catalog, turns, worker threads."""

    def __init__(self, engine, settings: WyomingSettings | None = None):
        self.settings = settings or WyomingSettings()
        self.engine = engine
        self.catalog = Catalog(engine, self.settings.voices_dir, self.settings.voice,
                               self.settings.language, self.settings.instruct)
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="qtts-wyoming")
        self.turns = Turns()  # the engine, taken in turns by the fair share (module docstring)
        self.generations = 0  # started generations, one per piece (tests and logs)
        self.connections: set = set()  # open handlers (the connection caps)

    def options(self):
        s = self.settings
        return to_options(SpeechFields(speed=s.speed, seed=s.seed, max_frames=s.max_frames))

    def pieces(self, text: str) -> list[str]:
        """The engine's sentence pieces of ``text`` (what one ``stream`` call would speak in turn)."""
        from ..text.sentences import pack_sentences

        limit = self.options().max_sentence_chars
        return [text] if len(text) <= limit else pack_sentences(text, limit) or [text]

    async def audio(self, text: str, choice: Choice, owner: str = LOCAL) -> AsyncIterator:
        """The AudioChunks of ``text`` as they are generated, piece by piece, each piece taking the
        engine in turn for client address ``owner``; ``max_request_frames`` in all.

        Input errors (empty or too long text, an engine's refusal) are raised before the first
        chunk; closing this iterator (or cancelling its consumer) stops the generation."""
        from ..text.prompt import clean_text

        if len(text) > self.settings.max_chars:
            raise InputError(f"the text has {len(text)} characters; this server's limit is "
                             f"{self.settings.max_chars} (--max-chars)")
        clean_text(text, what="the text")  # empty (nothing visible) -> InputError, the rule of every surface
        voice = await asyncio.to_thread(self.catalog.load_voice, choice)
        cap = FrameCap(self.settings.max_request_frames)
        for index, piece in enumerate(self.pieces(text)):
            async with contextlib.aclosing(self._generate(piece, choice, voice, owner, index)) as chunks:  # one turn
                async for chunk in chunks:
                    samples, _, _ = cap.take(chunk)
                    yield chunk if len(samples) == len(chunk.samples) else dataclasses.replace(chunk, samples=samples)
                    if cap.full:
                        return

    async def _generate(self, text: str, choice: Choice, voice, owner: str, index: int = 0) -> AsyncIterator:
        """Chunks of piece ``index`` from a worker thread (seeded as one ``stream`` call seeds its
        pieces); the engine turn is taken first and given back as soon as the worker returns, even
        while the consumer is still sending its chunks."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        options = dataclasses.replace(self.options(), language=choice.language, cancel=stop)
        if options.seed is not None:
            options = dataclasses.replace(options, seed=options.seed + index)
        await self.turns.take(owner)
        self.generations += 1

        def put(kind, value=None):
            with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is listening
                loop.call_soon_threadsafe(items.put_nowait, (kind, value))

        def work():
            try:
                chunks = self.engine.stream(text, voice=voice, speaker=choice.speaker, instruct=choice.instruct,
                                            options=options)
                try:
                    for chunk in chunks:
                        if stop.is_set():
                            break
                        put("chunk", chunk)
                finally:
                    chunks.close()
            except Exception as exc:  # delivered to the consumer, who reports it to the client
                put("error", exc)
            finally:
                put("end")

        try:
            done = loop.run_in_executor(self.executor, work)
        except BaseException:
            self.turns.give(owner)
            raise
        done.add_done_callback(lambda _: self.turns.give(owner))
        try:
            while True:
                kind, value = await items.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            stop.set()
            await asyncio.shield(done)  # the engine is free only when the worker has returned

    # -- serving ------------------------------------------------------------------------------
    def handler_factory(self):
        from .handler import QttsEventHandler

        def make(reader, writer):
            return QttsEventHandler(self, reader, writer)

        return make

    async def start(self, uri: str | None = None):
        """Start listening (non-blocking); returns the wyoming AsyncServer (``await .stop()``)."""
        from wyoming.server import AsyncServer

        server = AsyncServer.from_uri(uri or self.settings.uri)
        await server.start(self.handler_factory())
        return server

    async def run(self, uri: str | None = None) -> None:
        """Serve until cancelled (or SIGTERM)."""
        from wyoming.server import AsyncServer

        server = AsyncServer.from_uri(uri or self.settings.uri)
        try:
            await server.run(self.handler_factory())
        finally:
            self.executor.shutdown(wait=False, cancel_futures=True)
