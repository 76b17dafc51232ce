"""One Wyoming connection: ``describe``, ``synthesize`` and the streaming synthesize events.

Events are read by the library's loop (:class:`wyoming.server.AsyncEventHandler`) and never
wait for audio: a ``synthesize`` (or each complete sentence of a ``synthesize-chunk`` stream)
becomes a job on this connection's queue, and one task speaks the jobs in order, writing
``audio-start``, an ``audio-chunk`` per engine chunk as it is generated, and ``audio-stop``;
a streamed session ends with ``synthesize-stopped``. Because reading goes on meanwhile, a client
that disconnects is noticed at once (end of stream) and its generation is cancelled.

Errors (unknown voice, speaker or language, empty or too long text, a malformed event of any
kind, a failing engine) are answered with one ``error`` event, after which the server closes the
connection, so a client waiting for ``audio-stop`` never hangs. Limits: every write has a
deadline (``write_timeout_s``: a client that stops reading is dropped, and the engine is never
held while waiting for it, :mod:`qtts.wyoming.service`), a connection that sends nothing while
nothing is being spoken is closed after ``idle_timeout_s`` (error ``idle_timeout``), one past
``max_connections``, or past ``max_connections_per_client`` from one client address (the TCP
peer, :mod:`qtts.server.clients`), gets ``too_many_connections``, and at most ``MAX_JOBS``
utterances wait. Each utterance takes the engine in turns with the other connections (fair share
by address) and stops at ``max_request_frames``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from ..audio.writers import float_to_int16
from ..config import SAMPLE_RATE
from ..errors import InputError
from ..server.clients import peer_address
from ..text.prompt import speakable
from .catalog import VoiceNotFound
from .events import MalformedEvent, read_event, voice_fields, write_event

log = logging.getLogger(__name__)

WIDTH, CHANNELS = 2, 1
_STOPPED = object()  # job marker: the streamed session ended (send synthesize-stopped)
#: utterances (requests or streamed sentences) waiting on one connection at most
MAX_JOBS = 64


class QttsEventHandler(AsyncEventHandler):
    """Events of one client connection (see the module docstring)."""

    def __init__(self, service, reader, writer):
        super().__init__(reader, writer)
        self.service = service
        self.jobs: asyncio.Queue = asyncio.Queue()
        self.speaker_task: asyncio.Task | None = None
        self.session = None  # (choice, text buffer, characters so far) between synthesize-start and -stop
        self.pending = 0  # jobs queued or being spoken
        self.client = peer_address(writer.get_extra_info("peername"))  # who is a client: qtts.server.clients

    async def run(self) -> None:
        """Read events until the client leaves, breaks a rule, idles or the handler stops."""
        self._is_running = True
        svc, s = self.service, self.service.settings
        try:
            refusal = self._over_limit()
            if refusal:
                await self.fail(InputError(refusal), code="too_many_connections")
                return
            svc.connections.add(self)
            while self._is_running:
                try:
                    event = await asyncio.wait_for(read_event(self.reader), s.idle_timeout_s)
                except asyncio.TimeoutError:
                    if self.pending:
                        continue  # speaking: the client is waiting for audio, not idle
                    await self.fail(InputError(f"no event for {s.idle_timeout_s:g} s; the connection is closed"),
                                    code="idle_timeout")
                    break
                except MalformedEvent as exc:
                    await self.fail(exc, code="invalid_event")
                    break
                if event is None or not await self.handle_event(event):
                    break
        except (ConnectionError, OSError) as exc:
            log.debug("wyoming client gone: %s", exc)
        finally:
            svc.connections.discard(self)
            await self.disconnect()
            self.writer.close()

    def _over_limit(self) -> str | None:
        s, open_now = self.service.settings, self.service.connections
        if len(open_now) >= s.max_connections:
            return f"too many connections (this server takes {s.max_connections}); retry shortly"
        mine = sum(1 for c in open_now if c.client == self.client)
        if mine >= s.max_connections_per_client:
            return (f"too many connections from {self.client} (this server takes {s.max_connections_per_client} per "
                    "client address); close one, or retry shortly")
        return None

    async def write_event(self, event: Event) -> None:
        """Send ``event``; ConnectionError when the client reads nothing for ``write_timeout_s``."""
        await write_event(event, self.writer, self.service.settings.write_timeout_s)

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._dispatch(event)
        except InputError as exc:
            await self.fail(exc)
            return False
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field of the wrong shape
            await self.fail(InputError(f"malformed {str(event.type)[:40]!r} event ({type(exc).__name__}: "
                                       f"{str(exc)[:80]}); see the Wyoming protocol"), code="invalid_event")
            return False

    async def _dispatch(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.service.catalog.info(self.service.settings.streaming).event())
        elif Synthesize.is_type(event.type):
            if self.session is None:  # inside a session it only repeats the streamed text
                self.enqueue(_text(event, "synthesize"), self._choose(event))
        elif not self.service.settings.streaming:
            log.debug("ignoring %s: streaming is off", event.type)
        elif SynthesizeStart.is_type(event.type):
            self.session = [self._choose(event), "", 0]
        elif SynthesizeChunk.is_type(event.type):
            self._add_text(_text(event, "synthesize-chunk"))
        elif SynthesizeStop.is_type(event.type):
            self._end_session()
        else:
            log.debug("ignoring event %s", event.type)
        return True

    def _choose(self, event: Event):
        return self.service.catalog.resolve(*voice_fields(event))

    # -- streamed text -------------------------------------------------------------------------
    def _add_text(self, text: str) -> None:
        if self.session is None:
            raise InputError("synthesize-chunk outside a synthesize-start ... synthesize-stop session")
        self.session[2] += len(text)
        if self.session[2] > self.service.settings.max_chars:
            raise InputError(f"the streamed text passed this server's limit of {self.service.settings.max_chars} "
                             "characters (--max-chars)")
        done, self.session[1] = complete_sentences(self.session[1] + text)
        for sentence in done:
            self.enqueue(sentence, self.session[0])

    def _end_session(self) -> None:
        if self.session is None:
            raise InputError("synthesize-stop without synthesize-start")
        choice, rest, _ = self.session
        self.session = None
        if speakable(rest):
            self.enqueue(rest, choice)
        self.enqueue(None, _STOPPED)

    # -- speaking ------------------------------------------------------------------------------
    def enqueue(self, text: str | None, choice) -> None:
        if self.pending >= MAX_JOBS:
            raise InputError(f"more than {MAX_JOBS} utterances are waiting on this connection; wait for audio-stop "
                             "before sending more")
        self.pending += 1
        self.jobs.put_nowait((text, choice))
        if self.speaker_task is None:
            self.speaker_task = asyncio.create_task(self._speak_jobs(), name="qtts wyoming speaker")

    async def _speak_jobs(self) -> None:
        try:
            while True:
                text, choice = await self.jobs.get()
                try:
                    if choice is _STOPPED:
                        await self.write_event(SynthesizeStopped().event())
                    else:
                        await self._speak(text, choice)
                finally:
                    self.pending -= 1
        except InputError as exc:
            await self.fail(exc)
        except (ConnectionError, OSError) as exc:  # the client went away mid-write
            log.debug("wyoming client gone: %s", exc)
            await self.stop()
        except Exception as exc:
            log.error("generation failed", exc_info=exc)
            await self.fail(exc, code="generation_failed")

    async def _speak(self, text: str, choice) -> None:
        """One utterance: audio-start, its chunks as they are generated, audio-stop."""
        rate = None
        async with contextlib.aclosing(self.service.audio(text, choice, self.client)) as chunks:
            async for chunk in chunks:
                if rate is None:
                    rate = chunk.sample_rate
                    await self.write_event(AudioStart(rate=rate, width=WIDTH, channels=CHANNELS).event())
                if len(chunk.samples):
                    data = float_to_int16(chunk.samples).tobytes()
                    await self.write_event(AudioChunk(rate=rate, width=WIDTH, channels=CHANNELS, audio=data).event())
        if rate is None:  # (the engine always yields a final chunk; this keeps the event order if not)
            await self.write_event(AudioStart(rate=SAMPLE_RATE, width=WIDTH, channels=CHANNELS).event())
        await self.write_event(AudioStop().event())

    async def fail(self, exc: Exception, code: str | None = None) -> None:
        """Answer with one error event, then close the connection."""
        if code is None:
            code = "voice_not_found" if isinstance(exc, VoiceNotFound) else "invalid_request"
        text = str(exc) if isinstance(exc, InputError) else f"generation failed ({type(exc).__name__})"
        log.info("wyoming error %s: %s", code, text)
        with contextlib.suppress(ConnectionError, OSError):
            await self.write_event(Error(text=text, code=code).event())
        await self.stop()

    async def disconnect(self) -> None:
        """The client left (or the connection closes): stop speaking; the engine is released
        when the worker thread has returned (within one frame)."""
        task, self.speaker_task = self.speaker_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _text(event: Event, what: str) -> str:
    text = event.data.get("text") if isinstance(event.data, dict) else None
    if not isinstance(text, str):
        raise InputError(f"{what} needs 'text' as a string, got {type(text).__name__}")
    return text


def complete_sentences(text: str) -> tuple[list[str], str]:
    """Split streamed text into the sentences that are complete and the rest (kept as sent)."""
    from ..text.sentences import split_sentences

    pieces = split_sentences(text, min_chars=1) if text.strip() else []  # a short sentence is not held back
    if len(pieces) < 2:
        return [], text
    last = text.rfind(pieces[-1])
    return pieces[:-1], text[last:]
