"""Public API: ``qtts.load()`` -> :class:`TTS` with ``stream`` / ``synthesize`` / ``save`` / ``create_voice``.

``stream()`` is the one body: text -> sentence pieces -> prompt -> :class:`~qtts.generate.Generation`
frames -> stateful streaming decoder -> :class:`~qtts.audio.AudioChunk`. The first chunk is
decoded after ``first_chunk_frames`` frames, later ones every ``chunk_frames`` frames; the
decoder state continues across sentence pieces, so pieces join without a seam. Everything else
consumes ``stream()``.
"""

from __future__ import annotations

import logging
import os
import time
import unicodedata
from collections.abc import Iterator

import numpy as np

from . import synthesis_modes as modes
from .audio import SAMPLE_RATE, Audio, AudioChunk
from .errors import InputError
from .generate import LoopParams, WatchdogParams, frame_budget, generate
from .options import SynthesisOptions
from .voice import Voice, add_trailing_silence, load_reference_audio

log = logging.getLogger(__name__)

SAMPLES_PER_FRAME = 1920
FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME
MAX_TEXT_CHARS = 50_000


def load(model: str, plan=None, dtype: str = "float32", threads: int | None = None, backend=None) -> TTS:
    """Load a snapshot dir or hub id; ``plan`` (path, dict or Plan) picks runtimes per component."""
    from .runtime import Runtime

    return TTS(Runtime.open(model, plan=plan, dtype=dtype, threads=threads, backend=backend))


class TTS:
    """A loaded Qwen3-TTS model; see :attr:`thread_safe` for concurrent calls."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.config = runtime.config

    # -- facts ---------------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        return self.config.tts_model_type

    @property
    def model_size(self) -> str:
        return self.config.tts_model_size

    @property
    def speakers(self) -> list[str]:
        return self.config.speakers

    @property
    def languages(self) -> list[str]:
        return self.config.languages

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @property
    def thread_safe(self) -> bool:
        """True when concurrent ``stream()`` calls from several threads are safe on this object.

        Per-call state (talker KV, decoder state, random generator) lives in each call; the
        backend decides the rest by declaring ``thread_safe = True`` (the torch backend does).
        """
        return bool(getattr(self.runtime.backend, "thread_safe", False))

    # -- synthesis -----------------------------------------------------------------------------
    def stream(self, text: str, voice: Voice | str | None = None, speaker: str | None = None,
               instruct: str | None = None, language: str | None = None,
               options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """Yield audio chunks while generating; the last one has ``is_final`` and ``finish_reason``.

        Input errors (mode/checkpoint mismatch, unknown speaker or language, empty text) are
        raised at the call, before any chunk. Closing the iterator stops generation at once.
        """
        options = (options or SynthesisOptions()).resolve(self.config.generation)
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.load(os.fspath(voice))
        mode = modes.resolve(self.config, voice, speaker, instruct, language or options.language)
        pieces = self._pieces(text, options)
        return self._stream(pieces, mode, voice, options)

    def synthesize(self, text: str, **kwargs) -> Audio:
        """The whole utterance (consumes :meth:`stream`)."""
        chunks = list(self.stream(text, **kwargs))
        last = chunks[-1]
        samples = np.concatenate([c.samples for c in chunks]).astype(np.float32)
        return Audio(samples, SAMPLE_RATE, finish_reason=last.finish_reason, info=dict(last.info))

    def save(self, path: str, text: str, **kwargs) -> Audio:
        """Synthesize and write a 16-bit WAV atomically."""
        audio = self.synthesize(text, **kwargs)
        audio.save(path)
        return audio

    def create_voice(self, ref_audio, ref_text: str | None = None, name: str = "",
                     trailing_silence: float = 0.0, sample_rate: int | None = None) -> Voice:
        """A clone from reference audio; with ``ref_text`` it also keeps the ICL reference codes.

        ``trailing_silence`` seconds of silence are appended before encoding the reference
        codes (0.5 s stops the model from continuing the reference's last phoneme).
        """
        if self.model_type != "base":
            raise InputError(
                f"voice cloning needs a Base checkpoint; this one is '{self.model_type}' "
                f"(valid here: {modes.valid_conditioning(self.config)})"
            )
        if not 0.0 <= float(trailing_silence) <= 5.0:
            raise InputError(f"trailing_silence must be in [0, 5] seconds, got {trailing_silence}")
        wav = load_reference_audio(ref_audio, sample_rate)
        speaker = self.runtime.speaker_embedding(wav)
        codes = None
        if ref_text is not None:
            ref_text = clean_text(ref_text, what="ref_text")
            codes = self.runtime.encode_codes(add_trailing_silence(wav, trailing_silence))
        return Voice(speaker, ref_codes=codes, ref_text=ref_text, model_type=self.model_type,
                     model_size=self.model_size, name=name)

    # -- internals -----------------------------------------------------------------------------
    def _pieces(self, text: str, options: SynthesisOptions) -> list[str]:
        text = clean_text(text)
        if not options.split_sentences:
            return [text]
        from .frontend import split_sentences

        return split_sentences(text, max_chars=options.max_sentence_chars) or [text]

    def _loop_params(self, num_ids: int, options: SynthesisOptions, index: int) -> LoopParams:
        cap = int(self.config.generation.max_new_tokens)
        max_frames = options.max_frames or frame_budget(num_ids, cap=cap)
        seed = None if options.seed is None else int(options.seed) + index
        return LoopParams(
            talker=options.talker, residual=options.subtalker, max_frames=int(max_frames),
            tts_pad_id=self.config.tts_pad_token_id, eos_id=self.config.talker.codec_eos_token_id,
            suppress_from=self.config.talker.vocab_size - 1024, seed=seed,
            watchdog=WatchdogParams() if options.watchdog else None, cancel=options.cancel,
        )

    def _stream(self, pieces, mode, voice, options) -> Iterator[AudioChunk]:
        rt = self.runtime
        t0 = time.perf_counter()
        decoder = rt.new_decoder()
        if mode.icl:
            decoder.decode(voice.ref_codes)  # prime the decoder state; the reference audio is discarded
        stats = {"frames": 0, "pieces": len(pieces), "finish_reasons": [], "ttfa_s": None}
        chunker = _Chunker(decoder, options.first_chunk_frames, options.chunk_frames)
        for index, piece in enumerate(pieces):
            prompt, n_ids = rt.build_prompt(piece, mode, voice, options)
            gen = generate(rt.backend, prompt, self._loop_params(n_ids, options, index),
                           speaker=voice.speaker if mode.xvector else None)
            frames = iter(gen)
            try:
                for codes in frames:
                    stats["frames"] += 1
                    chunk = chunker.push(codes)
                    if chunk is not None:
                        yield _stamp(chunk, stats, t0)
            finally:
                frames.close()
            stats["finish_reasons"].append(gen.finish_reason)
            if gen.finish_reason == "cancelled":
                break
        final = chunker.flush()
        final.is_final = True
        final.finish_reason = worst_reason(stats["finish_reasons"])
        yield _stamp(final, stats, t0, final=True)


def _stamp(chunk: AudioChunk, stats: dict, t0: float, final: bool = False) -> AudioChunk:
    now = time.perf_counter() - t0
    if stats["ttfa_s"] is None and len(chunk.samples):
        stats["ttfa_s"] = now
    info = {"frames": stats["frames"], "wall_s": now, "ttfa_s": stats["ttfa_s"]}
    if final:
        audio_s = stats["frames"] / FRAME_RATE
        info.update(audio_s=audio_s, rtf=(now / audio_s) if audio_s else None,
                    pieces=stats["pieces"], finish_reasons=list(stats["finish_reasons"]))
    chunk.info = info
    return chunk


class _Chunker:
    """Groups frames: a first chunk of ``first`` frames, then chunks of ``size`` frames."""

    def __init__(self, decoder, first: int, size: int):
        self.decoder, self.first, self.size = decoder, first, size
        self.pending: list[np.ndarray] = []
        self.start = 0
        self.emitted = 0

    def push(self, codes: np.ndarray) -> AudioChunk | None:
        self.pending.append(codes)
        want = self.first if self.emitted == 0 else self.size
        return self._emit() if len(self.pending) >= want else None

    def flush(self) -> AudioChunk:
        return self._emit()

    def _emit(self) -> AudioChunk:
        n = len(self.pending)
        if n:
            samples = np.asarray(self.decoder.decode(np.stack(self.pending)), dtype=np.float32)
        else:
            samples = np.zeros(0, dtype=np.float32)
        chunk = AudioChunk(samples=samples, frame_start=self.start, num_frames=n)
        self.start += n
        self.emitted += 1
        self.pending = []
        return chunk


def worst_reason(reasons: list[str | None]) -> str:
    """One finish reason for several pieces: cancelled > runaway > length > eos."""
    for r in ("cancelled", "runaway", "length"):
        if r in reasons:
            return r
    return "eos"


def clean_text(text, what: str = "text") -> str:
    """NFC, control characters (except newline/tab) removed, stripped; empty -> InputError."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"{what} has {len(text)} characters; the limit is {MAX_TEXT_CHARS} per call (split it)")
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs"))
    text = text.strip()
    if not text:
        raise InputError(f"{what} is empty (after removing whitespace and control characters)")
    return text
