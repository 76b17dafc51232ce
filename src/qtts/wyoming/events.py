"""Wyoming events on the wire, strictly: every malformed event is a :class:`MalformedEvent` (the
handler answers it with the documented ``error`` event), and every write has a deadline.

An event is a JSON header line (``type``, optional ``data``, ``data_length``, ``payload_length``),
then ``data_length`` bytes of JSON merged into ``data``, then ``payload_length`` bytes of payload.
The library's reader drops the connection silently on bad JSON and raises (an unretrieved task
exception) on a missing ``type`` or a ``data`` that is not an object; this one names the problem.
"""

from __future__ import annotations

import asyncio
import json

from wyoming.event import Event, async_write_event

from ..errors import InputError

#: most bytes of ``data`` or payload one client event may carry (TTS requests carry text only)
MAX_EVENT_BYTES = 1024 * 1024


class MalformedEvent(InputError):
    """An event that does not follow the Wyoming framing (the message says what is wrong)."""


def _length(header: dict, key: str) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_EVENT_BYTES:
        raise MalformedEvent(f"'{key}' must be an integer in 0..{MAX_EVENT_BYTES}, got {str(value)[:40]}")
    return value


def _json_object(raw: bytes, what: str) -> dict:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise MalformedEvent(f"the event's {what} is not valid JSON") from None
    if not isinstance(value, dict):
        raise MalformedEvent(f"the event's {what} must be a JSON object, got {type(value).__name__}")
    return value


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event; None at the end of the stream; MalformedEvent for a broken one."""
    try:
        line = await reader.readline()
    except ValueError:  # longer than the reader's limit (64 KiB) without a newline
        raise MalformedEvent("an event header line is too long (over 64 KiB)") from None
    if not line:
        return None
    if not line.endswith(b"\n"):
        return None  # the client closed mid-line
    header = _json_object(line, "header line")
    kind = header.get("type")
    if not isinstance(kind, str) or not kind or len(kind) > 128:
        raise MalformedEvent("an event needs 'type', a string (e.g. synthesize)")
    data = header.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MalformedEvent(f"the event's 'data' must be a JSON object, got {type(data).__name__}")
    data_length, payload_length = _length(header, "data_length"), _length(header, "payload_length")
    try:
        if data_length:
            data = {**data, **_json_object(await reader.readexactly(data_length), "data")}
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        return None  # the client closed mid-event
    return Event(type=kind, data=data, payload=payload)


async def write_event(event: Event, writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Write ``event``; if the client has not taken it within ``timeout_s`` the connection is
    aborted and ConnectionError raised."""
    try:
        await asyncio.wait_for(async_write_event(event, writer), timeout_s)
    except asyncio.TimeoutError:
        writer.transport.abort()  # close() would wait for the unread buffer
        raise ConnectionError(f"the client read nothing for {timeout_s:g} s") from None


def voice_fields(event: Event) -> tuple[str | None, str | None, str | None]:
    """(name, speaker, language) of a synthesize event's optional ``voice`` object."""
    voice = event.data.get("voice")
    if voice is None:
        return None, None, None
    if not isinstance(voice, dict):
        raise InputError(f"'voice' must be an object like {{\"name\": ...}}, got {type(voice).__name__}")
    return voice.get("name"), voice.get("speaker"), voice.get("language")
