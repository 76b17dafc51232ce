"""Per-call options: sampling parameters and synthesis options (frozen dataclasses).

``None`` always means "the model default": the checkpoint's ``generation_config.json``
(read into :class:`qtts.config.GenerationConfig`), or the official wrapper's default where the
file has no such value. :meth:`SynthesisOptions.resolve` turns the ``None`` fields into
concrete values, so the generation loop never sees a ``None`` sampling parameter: a
:class:`LoopParams` is what one generation runs with (those values, the frame budget, the checkpoint's
token rules). :func:`frame_budget` is the default ``max_frames``; :class:`AnyCancel` joins ``cancel`` flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError

#: temperature bounds: below 0.01 the float32 division underflows toward inf (use greedy for
#: argmax); above 100 every token is about equally likely
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
#: repetition-penalty bounds (1 = off), for the same float32 reasons
MIN_PENALTY, MAX_PENALTY = 0.01, 100.0
#: speaking-rate bounds (OpenAI's ``speed`` range; qtts.audio.stretch time-stretches the audio)
MIN_SPEED, MAX_SPEED = 0.25, 4.0
#: SynthesisOptions.pipeline default (docs/history/performance.md has the A/B behind it)
PIPELINE_DEFAULT = True
#: the default frame budget (``max_frames=None``) = BUDGET_BASE + BUDGET_PER_TOKEN * text tokens (12.5
#: frames per second of audio): 40 frames = 3.2 s of slack, 8 frames = 0.64 s per text token (a
#: spelled-out digit is one token and one word; normal speech needs 2-4 frames per token).
BUDGET_BASE = 40
BUDGET_PER_TOKEN = 8


@dataclass(frozen=True)
class SamplingParams:
    """How one token is chosen from logits (talker codebook 0, or the code predictor).

    Semantics follow Hugging Face ``generate`` (see :mod:`qtts.engine.generate` and docs/text.md).
    """

    # False = greedy argmax (still after repetition penalty / suppression, like HF).
    do_sample: bool | None = None
    # Logits are divided by it before top-k/top-p; < 1 sharpens, > 1 flattens. Official 0.9.
    temperature: float | None = None
    # Keep only the k most likely ids (ties at the k-th value are kept, as in HF); 0 = off.
    top_k: int | None = None
    # Nucleus: smallest set whose probability reaches top_p (HF semantics); 1.0 = off.
    top_p: float | None = None
    # HF penalty over the ids generated so far (talker only in the official code; 1.0 = off).
    repetition_penalty: float | None = None

    def merged(self, defaults: SamplingParams) -> SamplingParams:
        """Fill every ``None`` field from ``defaults`` and validate the result."""
        values = {
            f.name: getattr(defaults, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }
        out = SamplingParams(**values)
        out.validate()
        return out

    def validate(self) -> None:
        """Raise InputError for out-of-range values (``None`` fields are not checked).

        The float32 math needs temperature and repetition penalty in [0.01, 100]: logits
        divided by a subnormal temperature overflow to inf and the draw walks off the vocabulary.
        """
        if self.temperature is not None and not _within(self.temperature, MIN_TEMPERATURE, MAX_TEMPERATURE):
            raise InputError(f"temperature must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got "
                             f"{self.temperature}; use greedy for argmax")
        if self.top_k is not None and not _is_count(self.top_k):
            raise InputError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if self.top_p is not None and not _within(self.top_p, 0.0, 1.0, low_open=True):
            raise InputError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.repetition_penalty is not None and not _within(self.repetition_penalty, MIN_PENALTY, MAX_PENALTY):
            raise InputError(f"repetition_penalty must be in [{MIN_PENALTY}, {MAX_PENALTY}] (1 = off), got "
                             f"{self.repetition_penalty}")


def _within(value, low: float, high: float, low_open: bool = False) -> bool:
    """``low <= value <= high`` for a real number (False for NaN, strings, None)."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return (low < v if low_open else low <= v) and v <= high


def _is_count(value) -> bool:
    """An integer >= 0 (5.0 counts; inf, NaN, 2.5, True and strings do not)."""
    if isinstance(value, bool):
        return False
    try:
        return int(value) == value and value >= 0
    except (TypeError, ValueError, OverflowError):
        return False


def talker_defaults(gen) -> SamplingParams:
    """Codebook-0 defaults from a :class:`qtts.config.GenerationConfig` (or None: official values)."""
    from .config import GenerationConfig

    g = gen if gen is not None else GenerationConfig()
    return SamplingParams(
        do_sample=bool(g.do_sample),
        temperature=float(g.temperature),
        top_k=int(g.top_k),
        top_p=float(g.top_p),
        repetition_penalty=float(g.repetition_penalty),
    )


def predictor_defaults(gen) -> SamplingParams:
    """Predictor defaults (the ``subtalker_*`` keys); the official code applies no repetition penalty there."""
    from .config import GenerationConfig

    g = gen if gen is not None else GenerationConfig()
    return SamplingParams(
        do_sample=bool(g.subtalker_dosample),
        temperature=float(g.subtalker_temperature),
        top_k=int(g.subtalker_top_k),
        top_p=float(g.subtalker_top_p),
        repetition_penalty=1.0,
    )


@dataclass(frozen=True)
class SynthesisOptions:
    """Everything about one synthesis call that is not the text or the voice."""

    # Codebook 0 (talker): None fields come from generation_config.json.
    talker: SamplingParams = field(default_factory=SamplingParams)
    # Codebooks 1..15 (the predictor): the subtalker_* values of generation_config.json.
    predictor: SamplingParams = field(default_factory=SamplingParams)
    # Seeds the numpy Generator so a call is reproducible; None = fresh entropy each call.
    seed: int | None = None
    # Shortcut for do_sample=False on both stages (deterministic; what parity tests use).
    greedy: bool = False
    # Frame budget per text piece; None = frame_budget's formula below (runaway guard).
    max_frames: int | None = None
    # Language name ('auto', 'english', ...); None = 'auto' unless the call passes one.
    language: str | None = None
    # Text layout: True = whole text in the prefill, False = text fed one token per frame;
    # None = the official wrapper default (False for voice clone, True for CustomVoice/VoiceDesign).
    non_streaming_text: bool | None = None
    # Frames decoded for the first audio chunk: small = low time-to-first-audio (1 = 80 ms of
    # audio after one generated frame; bundles carry a 1-frame vocoder step for it).
    first_chunk_frames: int = 1
    # Largest later chunk: chunk sizes double from first_chunk_frames up to this (1, 2, 4, 8, 8,
    # ...); larger = fewer, cheaper-per-frame vocoder calls, more latency per chunk.
    chunk_frames: int = 8
    # Two cores at once: generation on a worker thread, the vocoder on the calling thread one
    # chunk behind (qtts.engine.stream). Same chunks, bit-identical audio; False = one thread does both.
    pipeline: bool = PIPELINE_DEFAULT
    # Split long text at sentence boundaries, whole sentences packed into pieces of at most
    # max_sentence_chars (a text that fits is one piece); each piece gets its own budget (limits drift).
    split_sentences: bool = True
    # Pieces are at most this many characters when splitting (long prompts drift and run away).
    max_sentence_chars: int = 200
    # Speaking rate (0.25-4.0; 2.0 = twice as fast): a pitch-preserving time stretch of the audio
    # (qtts.audio.stretch, streaming WSOLA); the model itself has no rate control. 1.0 = untouched.
    speed: float = 1.0
    # Stop a stuck code stream early (finish_reason 'runaway') instead of running to the budget.
    watchdog: bool = True
    # stream_text: talker KV slots (frames) of one context; a longer text goes on in a new context
    # from a sentence end (1024 frames = 82 s of audio, ~235 MB of fp32 KV on the 0.6B talker).
    context_frames: int = 1024
    # Word timings on the chunks (AudioChunk.words): each text piece is aligned by the forced
    # aligner on its own worker after its audio is out (qtts.align.timing); without an aligner
    # checkpoint every piece gets its exact time span instead (unit "piece"). Audio is unchanged.
    timestamps: bool = False
    # Cross-thread cancellation: an object with is_set() (threading.Event); checked before
    # every frame, so a server can stop a generation within one frame of a disconnect.
    cancel: Any = field(default=None, compare=False)

    def validate(self) -> None:
        """Raise InputError naming the bad field and its valid range."""
        self.talker.validate()
        self.predictor.validate()
        if self.max_frames is not None and self.max_frames < 1:
            raise InputError(f"max_frames must be >= 1 (or None for the automatic budget), got {self.max_frames}")
        if self.first_chunk_frames < 1 or self.chunk_frames < 1:
            raise InputError(
                f"first_chunk_frames and chunk_frames must be >= 1, got "
                f"{self.first_chunk_frames} and {self.chunk_frames}"
            )
        if self.max_sentence_chars < 8:
            raise InputError(f"max_sentence_chars must be >= 8, got {self.max_sentence_chars}")
        if not 64 <= self.context_frames <= 32768:
            raise InputError(f"context_frames must be in [64, 32768], got {self.context_frames}")
        if not _within(self.speed, MIN_SPEED, MAX_SPEED):
            raise InputError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}] (1.0 = unchanged), got {self.speed}")

    def resolve(self, generation_config=None) -> SynthesisOptions:
        """A copy whose talker/predictor params are concrete (greedy applied)."""
        self.validate()
        talker = self.talker.merged(talker_defaults(generation_config))
        predictor = self.predictor.merged(predictor_defaults(generation_config))
        if self.greedy:
            talker = dataclasses.replace(talker, do_sample=False)
            predictor = dataclasses.replace(predictor, do_sample=False)
        return dataclasses.replace(self, talker=talker, predictor=predictor)


@dataclass(frozen=True)
class WatchdogParams:
    """Runaway detector on the codebook-0 stream; ``None`` fields disable that check."""

    #: same code 0 this many frames in a row -> runaway (36 frames = 2.9 s of one code)
    max_repeat: int | None = 36
    #: a cycle of period 2..max_period repeated exactly over the last ``window`` frames -> runaway
    window: int | None = 60
    max_period: int = 8


@dataclass(frozen=True)
class LoopParams:
    """Everything the loop needs besides the backend and the prompt (build it with :meth:`for_config`)."""

    #: concrete :class:`SamplingParams` for codebook 0 (talker) and 1..15 (predictor)
    talker: Any
    predictor: Any
    #: frame budget; the loop yields at most this many frames
    max_frames: int
    #: the talker token rules: <tts_pad> text id fed once the trailing text is exhausted; codec
    #: EOS (codebook 0); ids >= suppress_from except EOS are never sampled; EOS is blocked for the
    #: first ``min_frames`` code-0 samples (HF min_new_tokens=2)
    tts_pad_id: int = 151671
    eos_id: int = 2150
    suppress_from: int = 2048
    min_frames: int = 2
    seed: int | None = None
    watchdog: WatchdogParams | None = field(default_factory=WatchdogParams)
    #: an object with ``is_set()`` (e.g. threading.Event); checked before every frame, so a
    #: cancel from another thread stops the loop within one frame (finish_reason 'cancelled')
    cancel: Any = field(default=None, compare=False)

    @classmethod
    def for_config(cls, config, talker, predictor, max_frames: int, **kw) -> LoopParams:
        """The talker token rules of a checkpoint (its <tts_pad>, EOS and control-id range)."""
        return cls(talker=talker, predictor=predictor, max_frames=int(max_frames),
                   tts_pad_id=config.tts_pad_token_id, eos_id=config.talker.codec_eos_token_id,
                   suppress_from=config.talker.vocab_size - 1024, **kw)  # fmt: skip


def frame_budget(num_text_tokens: int, cap: int | None = None) -> int:
    """Max frames for a text of ``num_text_tokens`` target tokens (``max_frames``' default; see BUDGET_BASE)."""
    budget = BUDGET_BASE + BUDGET_PER_TOKEN * max(0, int(num_text_tokens))
    return budget if cap is None else min(budget, int(cap))


class AnyCancel:
    """A ``cancel`` flag that is set when any of ``flags`` (objects with ``is_set()``, or None) is."""

    def __init__(self, *flags):
        self.flags = [f for f in flags if f is not None]

    def is_set(self) -> bool:
        return any(f.is_set() for f in self.flags)
