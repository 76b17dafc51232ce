"""Server settings: one frozen dataclass, filled by ``qtts serve`` flags or by tests."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

#: response formats the server can produce (see :mod:`qtts.server.formats`)
SUPPORTED_FORMATS = ("wav", "pcm", "flac", "mp3", "opus")


@dataclass(frozen=True)
class ServerSettings:
    #: bind address; loopback by default so a fresh server is not exposed to the network
    host: str = "127.0.0.1"
    #: TCP port (0 picks a free one)
    port: int = 8000
    #: where uploaded voices are stored as ``<id>.voice``; None disables uploads
    voices_dir: str | None = None
    #: generations (and voice creations) running at once; each gets its own worker thread
    max_concurrency: int = 1
    #: > 1: one batched engine (qtts.engine.batching) steps up to this many generations together, and this
    #: many run at once (instead of max_concurrency engines, each a copy of the weights)
    max_batch: int = 1
    #: streams served at once, so that each stays real-time (``qtts serve --capacity N``, or measured
    #: at start-up with ``--capacity auto``); more wait in the queue. None: every slot
    capacity: int | None = None
    #: requests allowed to wait for a worker; one more gets 429 with Retry-After
    max_queue: int = 8
    #: a request that waited this long for a worker gets 503 (the client gave up by then anyway)
    queue_timeout_s: float = 120.0
    #: longest accepted ``input`` text, in characters
    max_input_chars: int = 4096
    #: hard cap on codec frames per request (12.5 frames per second of audio); a request may ask less
    max_frames: int = 2048
    #: largest accepted reference-audio upload, in bytes
    max_upload_bytes: int = 10 * 1024 * 1024
    #: largest accepted JSON request body, in bytes
    max_body_bytes: int = 256 * 1024
    #: frames per streamed chunk after the first (None = engine default, 8); the worker notices a
    #: client disconnect between chunks, so this also bounds the frames generated after one
    chunk_frames: int | None = None
    #: format used when a request names none (mp3 as OpenAI; ``--default-format wav`` for the old default)
    default_response_format: str = "mp3"
    #: ``(name, voice)`` pairs: ``voice: name`` in a request means ``voice`` (``--voice-alias``); they
    #: override the default OpenAI-name table of :mod:`qtts.server.aliases`
    voice_aliases: tuple = ()
    #: model id reported by /health and /v1/models; requests may name any model (one is served)
    model_id: str = "qtts"
    #: emit one JSON access-log line per request on the ``qtts.server.access`` logger
    access_log: bool = True
    #: a connection must deliver its complete request headers within this many seconds of opening
    #: (or of the previous response): silent and trickling clients are closed (408)
    header_timeout_s: float = 10.0
    #: the whole request body must arrive within this many seconds of its headers (a 10 MB
    #: upload needs ~1.4 Mbit/s); a slower body, or a Content-Length never reached, is closed (408)
    body_timeout_s: float = 60.0
    #: a response whose client reads nothing for this long (send buffer full) is aborted
    write_timeout_s: float = 60.0
    #: an idle keep-alive connection is closed after this many seconds
    keep_alive_s: float = 5.0
    #: open connections at most; one more is answered 503 and closed at once
    max_connections: int = 256
    #: open connections (HTTP and WebSocket) from one client address at most; one more gets 503
    #: (a named proxy, ``forwarded_allow_ips``, counts against max_connections only)
    max_connections_per_client: int = 64
    #: reverse proxies (IP addresses or networks; ``*``: any peer) whose X-Forwarded-For names the
    #: client; none by default: a client is the TCP peer (:mod:`qtts.server.clients`)
    forwarded_allow_ips: tuple[str, ...] = ()
    #: origins (``scheme://host[:port]``) whose pages may drive the API besides the server's own
    #: (``*``: any); others get 403 on WebSocket upgrades and state-changing requests
    allow_origins: tuple[str, ...] = ()
    #: Host header names accepted besides loopback names and the bound address (``*``: any): the
    #: names a reverse proxy or a LAN client uses to reach the server
    allow_hosts: tuple[str, ...] = ()

    #: WebSocket /v1/audio/speech/stream: longest text.delta message, in characters
    ws_max_message_chars: int = 4096
    #: WebSocket: all text of one session, in characters (one answer per connection)
    ws_max_session_chars: int = 20000
    #: WebSocket: a session that neither sends a message nor receives audio for this long (before
    #: text.done) is closed; covers a client that never sends text.done
    ws_idle_timeout_s: float = 30.0
    #: WebSocket: longest session, from connect to the last audio
    ws_max_session_s: float = 1800.0
    #: WebSocket: messages per second one socket may send (a burst of twice as many is allowed);
    #: more closes the session (1008)
    ws_max_messages_per_s: float = 200.0
    #: WebSocket: live sessions open at once from one client address; one more is closed with 1013
    #: (``too_many_sessions``). Behind a reverse proxy, name it in ``forwarded_allow_ips``
    ws_max_sessions_per_client: int = 2
    #: WebSocket: an utterance's text input ends (the talker speaks what it has, the worker slot goes
    #: back) after this many seconds without new text; while other requests wait for a slot, also
    #: when the utterance has held its slot this much longer than the audio it made (it waits for
    #: text). Text after that is a new utterance, admitted like any request (docs/server.md)
    ws_utterance_gap_s: float = 1.0
    #: WebSocket: pings per second one socket may send (a burst of twice as many); more closes
    #: it (1008). Pongs are written only while the client reads (backpressure)
    ws_max_pings_per_s: float = 5.0

    def __post_init__(self):
        self._check_counts()
        self._check_lists()
        if not 0 <= self.port <= 65535:
            raise InputError(f"port={self.port}: must be in 0..65535")

    def _check_counts(self) -> None:
        if self.max_concurrency < 1:
            raise InputError(f"max_concurrency={self.max_concurrency}: must be >= 1")
        if self.max_batch < 1:
            raise InputError(f"max_batch={self.max_batch}: must be >= 1")
        if self.max_batch > 1 and self.max_concurrency > 1:
            raise InputError(f"max_batch={self.max_batch} and max_concurrency={self.max_concurrency}: use one "
                             "batched engine (--max-batch) or several engines (--max-concurrency), not both")
        if self.capacity is not None and self.capacity < 1:
            raise InputError(f"capacity={self.capacity}: must be >= 1")
        if self.max_queue < 0:
            raise InputError(f"max_queue={self.max_queue}: must be >= 0")
        for name in ("max_input_chars", "max_frames", "max_upload_bytes", "max_body_bytes", "max_connections",
                     "max_connections_per_client", "ws_max_message_chars", "ws_max_session_chars",
                     "ws_max_sessions_per_client"):
            if getattr(self, name) < 1:
                raise InputError(f"{name}={getattr(self, name)}: must be >= 1")
        for name in ("header_timeout_s", "body_timeout_s", "write_timeout_s", "keep_alive_s", "queue_timeout_s",
                     "ws_idle_timeout_s", "ws_max_session_s", "ws_utterance_gap_s"):
            if not 0 < getattr(self, name) <= 86400:
                raise InputError(f"{name}={getattr(self, name)}: must be in (0, 86400] seconds")
        from ..text.prompt import MAX_TEXT_CHARS

        for name in ("max_input_chars", "ws_max_message_chars"):
            if getattr(self, name) > MAX_TEXT_CHARS:
                raise InputError(f"{name}={getattr(self, name)}: must be <= {MAX_TEXT_CHARS} (the engine's limit per "
                                 "call)")
        if self.default_response_format not in SUPPORTED_FORMATS:
            raise InputError(
                f"default_response_format={self.default_response_format!r}: "
                f"choose one of {', '.join(SUPPORTED_FORMATS)}"
            )
        for name in ("ws_max_messages_per_s", "ws_max_pings_per_s"):
            if not 0 < getattr(self, name) <= 1e6:
                raise InputError(f"{name}={getattr(self, name)}: must be in (0, 1000000] per second")

    def _check_lists(self) -> None:
        """Voice aliases, origin / host allow lists ("a,b" or a list) and the named proxies."""
        from .aliases import parse_alias

        for pair in self.voice_aliases:
            parse_alias("=".join(pair) if isinstance(pair, (tuple, list)) and len(pair) == 2 else str(pair))
        for name in ("allow_origins", "allow_hosts"):  # "a,b" (Ray's string arguments) or a list
            value = getattr(self, name)
            if isinstance(value, str):
                value = [x.strip() for x in value.split(",") if x.strip()]
            object.__setattr__(self, name, tuple(value))
        from .clients import check_proxies

        object.__setattr__(self, "forwarded_allow_ips", check_proxies(self.forwarded_allow_ips))
        from .origin import check_allow_lists

        check_allow_lists(self.allow_origins, self.allow_hosts)

    @property
    def slots(self) -> int:
        """Generations running at once: the batch size of one batched engine, or one per engine
        (at most ``capacity``)."""
        slots = max(self.max_concurrency, self.max_batch)
        return slots if self.capacity is None else min(slots, self.capacity)
