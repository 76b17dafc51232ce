"""A speech request, as every surface takes it, to :class:`qtts.options.SynthesisOptions` and its frame cap.

``POST /v1/audio/speech``, the live WebSocket, Wyoming and ``qtts say`` read different fields from
their clients (JSON, a ``session.update``, a server's settings, command-line flags) but ask the same
things: sampling, seed, speed, a frame budget, word timings. :class:`SpeechFields` holds those;
:func:`to_options` is the one mapping to options (with the server's :class:`Caps`: its frame limit
and chunk size), and :class:`FrameCap` the one place that cuts the audio at the frame cap; :func:`with_cancel` hands
a job's cancel event to the engine, :func:`count_tokens` counts a request's text tokens.
Torch- and fastapi-free: the CLI and Wyoming import it as the server does.
"""

from __future__ import annotations

import dataclasses

from ..config import SAMPLES_PER_FRAME
from ..errors import InputError

#: the request fields this module maps (names as the HTTP API spells them)
FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "greedy", "speed", "max_frames",
          "timestamps")


@dataclasses.dataclass(frozen=True)
class SpeechFields:
    """What a client asks of one synthesis (None = the model's or the server's default)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    greedy: bool | None = None
    speed: float | None = None
    max_frames: int | None = None
    timestamps: bool | None = None

    @classmethod
    def of(cls, source) -> SpeechFields:
        """The fields of any object that has them by these names (a pydantic request, settings)."""
        return cls(**{name: getattr(source, name, None) for name in FIELDS})


@dataclasses.dataclass(frozen=True)
class Caps:
    """What a server allows: ``max_frames`` (a request's budget at most; None = no limit) and the
    ``chunk_frames`` it streams with (None or 0 = the engine's default)."""

    max_frames: int | None = None
    chunk_frames: int | None = None


def check_max_frames(max_frames: int | None, caps: Caps) -> None:
    """InputError when a request's frame budget is above the server's limit."""
    if max_frames is not None and caps.max_frames is not None and max_frames > caps.max_frames:
        raise InputError(f"max_frames={max_frames} exceeds this server's limit of {caps.max_frames}")


def to_options(fields: SpeechFields, caps: Caps = Caps(), **extra):
    """The :class:`~qtts.options.SynthesisOptions` of ``fields`` under ``caps`` (``extra``: surface-only
    options, such as the CLI's ``split_sentences``). Not validated: the caller maps the error."""
    from ..options import SamplingParams, SynthesisOptions

    check_max_frames(fields.max_frames, caps)
    talker = SamplingParams(temperature=fields.temperature, top_k=fields.top_k, top_p=fields.top_p,
                            repetition_penalty=fields.repetition_penalty)
    kwargs = {"talker": talker, "seed": fields.seed, "greedy": bool(fields.greedy), "max_frames": fields.max_frames,
              "speed": 1.0 if fields.speed is None else fields.speed, "timestamps": bool(fields.timestamps)}
    if caps.chunk_frames:
        kwargs["chunk_frames"] = caps.chunk_frames
    return SynthesisOptions(**{**kwargs, **extra})


def frame_cap(fields: SpeechFields, caps: Caps) -> int | None:
    """The frames a request may send in all: its own budget, else the server's limit."""
    return fields.max_frames or caps.max_frames


def capped_chunk(chunk, frames: int, cap: int):
    """(samples, frames) of ``chunk`` that fit under a cap of ``cap`` frames, ``frames`` already sent."""
    samples = chunk.samples
    n = chunk.num_frames or -(-len(samples) // SAMPLES_PER_FRAME)
    if frames + n > cap:
        keep = max(0, cap - frames)
        samples = samples[: len(samples) * keep // n] if n else samples[:0]  # (stretched: not 1920 per frame)
        n = keep
    return samples, n


def with_cancel(options, cancel):
    """Hand the request's cancel event to the engine when its options take one (a per-frame
    check); otherwise the caller stops the stream at the next chunk boundary."""
    if options is not None and "cancel" in {f.name for f in dataclasses.fields(options)}:
        return dataclasses.replace(options, cancel=cancel)
    return options


def count_tokens(tokenizer, text: str) -> int:
    """A request's text tokens (OpenAI's ``usage.input_tokens``; no tokenizer: 0)."""
    return len(tokenizer.encode(text)) if tokenizer is not None else 0


class FrameCap:
    """The frames sent so far against a cap: :meth:`take` cuts each chunk to what still fits."""

    def __init__(self, cap: int, frames: int = 0):
        self.cap, self.frames = cap, frames

    def take(self, chunk):
        """(samples, frames, capped) of ``chunk``: ``capped`` when the cap is reached before the
        chunk that ends the audio (the stream is cut; the caller stops generating)."""
        samples, n = capped_chunk(chunk, self.frames, self.cap)
        self.frames += n
        return samples, n, self.full and not chunk.is_final

    def over(self, chunks):
        """(chunk, samples, frames, capped) of each of ``chunks``, :meth:`take` applied (past the
        cap: no samples, 0 frames)."""
        for chunk in chunks:
            yield (chunk, *self.take(chunk))

    @property
    def full(self) -> bool:
        return self.frames >= self.cap
