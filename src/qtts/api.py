"""Public API: ``qtts.load()`` -> :class:`TTS` with ``stream`` / ``stream_text`` / ``synthesize`` /
``save`` / ``create_voice``.

``stream()`` is the one body: text -> sentence pieces -> prompt -> :class:`~qtts.generate.Generation`
frames -> the stateful streaming vocoder -> :class:`~qtts.audio.AudioChunk`. The first chunk is
decoded after ``first_chunk_frames`` frames, later ones every ``chunk_frames`` frames; the
vocoder state continues across sentence pieces, so pieces join without a seam. Everything else
consumes ``stream()``. ``stream_text()`` is the same body over text that is still arriving
(:mod:`qtts.live`): one talker context across sentences, the same chunking and vocoder stream.
The parts it runs on come from :func:`qtts.backends.open`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import numpy as np

from .audio import Audio, AudioChunk
from .config import FRAME_RATE, SAMPLE_RATE
from .errors import InputError
from .generate import LoopParams, WatchdogParams, frame_budget, generate
from .options import SynthesisOptions
from .prompt import build_prompt, clean_text, live_prompt, resolve_mode, text_stream, valid_conditioning
from .voice import Voice, add_trailing_silence, load_reference_audio

log = logging.getLogger(__name__)


def load(model: str, plan=None, dtype: str = "float32", threads: int | None = None, backend=None) -> TTS:
    """Load a snapshot dir or hub id; ``plan`` (path, dict or Plan) picks runtimes per component.

    ``threads`` None picks by model size (:func:`qtts.backends.default_threads`).
    """
    from .backends import open as open_components

    return TTS(open_components(model, plan=plan, dtype=dtype, threads=threads, backend=backend))


class TTS:
    """A loaded Qwen3-TTS model over its :class:`~qtts.backends.Components`; see :attr:`thread_safe`."""

    def __init__(self, components):
        self.components = components
        self.config = components.config

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

        Per-call state (talker KV, vocoder state, random generator) lives in each call; the
        backend decides the rest by declaring ``thread_safe = True`` (the torch backend does).
        """
        return self.components.thread_safe

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
        mode = resolve_mode(self.config, voice, speaker, instruct, language or options.language)
        pieces = self._pieces(text, options)
        return with_speed(self._stream(pieces, mode, options), options.speed)

    def stream_text(self, pieces, voice: Voice | str | None = None, speaker: str | None = None,
                    instruct: str | None = None, language: str | None = None,
                    options: SynthesisOptions | None = None):
        """Speak text while it is still being written: ``pieces`` are its parts in order (an LLM's
        deltas), as an iterable, an async iterable, or a :class:`qtts.live.TextFeed`.

        Yields :class:`AudioChunk` like :meth:`stream` (an async iterator for an async iterable).
        Text goes to the talker a token at a time as tokens become final; when the talker is
        ahead of the text it waits. With greedy decoding the audio equals ``stream(text,
        split_sentences=False, non_streaming_text=False)`` of the joined text while the text fits
        one talker context (``options.context_frames``); a longer text goes on in a new context
        from a sentence end. ``options.speed`` stretches the audio as in :meth:`stream`.
        Conditioning errors are raised at the call; an empty text when the input ends. Closing
        the iterator stops generation within one frame.
        """
        options = (options or SynthesisOptions()).resolve(self.config.generation)
        if options.non_streaming_text:
            raise InputError("stream_text feeds text as it arrives, which needs the streaming text layout; "
                             "leave non_streaming_text unset (or False)")
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.load(os.fspath(voice))
        mode = resolve_mode(self.config, voice, speaker, instruct, language or options.language)
        if hasattr(pieces, "__aiter__"):
            from .textsource import astream

            return astream(self, pieces, mode, options)
        from .live import TextFeed

        if not isinstance(pieces, TextFeed) and not hasattr(pieces, "__iter__"):
            raise InputError(f"stream_text takes an iterable of strings, got {type(pieces).__name__}")
        return with_speed(self._stream_live(pieces, mode, options), options.speed)

    def synthesize(self, text: str, **kwargs) -> Audio:
        """The whole utterance (consumes :meth:`stream`)."""
        chunks = list(self.stream(text, **kwargs))
        last = chunks[-1]
        samples = np.concatenate([c.samples for c in chunks]).astype(np.float32)
        return Audio(samples, SAMPLE_RATE, finish_reason=last.finish_reason, info=dict(last.info))

    def save(self, path: str, text: str, **kwargs) -> Audio:
        """Synthesize and write atomically in the format of the extension (:meth:`Audio.save`)."""
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
                f"(valid here: {valid_conditioning(self.config)})"
            )
        if not 0.0 <= float(trailing_silence) <= 5.0:
            raise InputError(f"trailing_silence must be in [0, 5] seconds, got {trailing_silence}")
        wav = load_reference_audio(ref_audio, sample_rate)
        speaker = self.components.speaker_encoder.embed(wav)
        codes = None
        if ref_text is not None:
            ref_text = clean_text(ref_text, what="ref_text")
            codes = self.components.speech_encoder.encode(add_trailing_silence(wav, trailing_silence))
        return Voice(speaker, ref_codes=codes, ref_text=ref_text, model_type=self.model_type,
                     model_size=self.model_size, name=name)

    # -- internals -----------------------------------------------------------------------------
    def _pieces(self, text: str, options: SynthesisOptions) -> list[str]:
        text = clean_text(text)
        if not options.split_sentences:
            return [text]
        from .frontend import split_sentences

        return split_sentences(text, max_chars=options.max_sentence_chars) or [text]

    def _loop_params(self, max_frames: int, options: SynthesisOptions, index: int, cancel=None) -> LoopParams:
        seed = None if options.seed is None else int(options.seed) + index
        return LoopParams.for_config(
            self.config, options.talker, options.predictor, max_frames, seed=seed,
            watchdog=WatchdogParams() if options.watchdog else None, cancel=cancel or options.cancel,
        )  # fmt: skip

    def _stream(self, pieces, mode, options) -> Iterator[AudioChunk]:
        parts = self.components
        t0 = time.perf_counter()
        vocoder = parts.vocoder.stream()
        if mode.icl:
            vocoder.decode(mode.ref_codes)  # prime the vocoder state; the reference audio is discarded
        stats = {"frames": 0, "pieces": len(pieces), "finish_reasons": [], "ttfa_s": None}
        chunker = _Chunker(vocoder, options.first_chunk_frames, options.chunk_frames)
        for index, piece in enumerate(pieces):
            prompt = build_prompt(self.config, parts.tokenizer, piece, mode, options.non_streaming_text)
            budget = options.max_frames or frame_budget(prompt.text_token_count,
                                                        cap=int(self.config.generation.max_new_tokens))
            gen = generate(parts.backend, prompt, self._loop_params(budget, options, index), speaker=mode.xvector)
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
        yield _final(chunker, stats, t0)

    def _stream_live(self, source, mode, options) -> Iterator[AudioChunk]:
        """:meth:`stream_text`'s body: contexts from a :class:`~qtts.live.TextFeed` (module doc)."""
        from .live import AnyCancel, TextFeed, context_limits
        from .textsource import start_reader

        parts, t0 = self.components, time.perf_counter()
        feed = source if isinstance(source, TextFeed) else TextFeed(parts.tokenizer)
        if feed is not source:
            start_reader(source, feed)
        cancel = AnyCancel(options.cancel, feed)
        cap = options.max_frames or min(options.context_frames, int(self.config.generation.max_new_tokens))
        max_tokens, budget = context_limits(cap, options.max_frames)
        stream = text_stream(self.config, parts.tokenizer, mode)
        vocoder = parts.vocoder.stream()
        if mode.icl:
            vocoder.decode(mode.ref_codes)  # prime the vocoder state; the reference audio is discarded
        stats = {"frames": 0, "pieces": 0, "finish_reasons": [], "ttfa_s": None, "feed": feed, "waited_s": 0.0}
        chunker = _Chunker(vocoder, options.first_chunk_frames, options.chunk_frames)
        try:
            while (ctx := feed.next_context(stream, parts.backend, max_tokens, budget, cancel)) is not None:
                prompt = live_prompt(self.config, parts.tokenizer, mode, ctx.prefill_body())
                lp = self._loop_params(cap, options, stats["pieces"], cancel)
                gen = generate(parts.backend, prompt, lp, speaker=mode.xvector, text=ctx)
                yield from _live_frames(gen, chunker, stats, t0)
                ctx.end(gen.finish_reason)
                stats["pieces"] += 1
                stats["waited_s"] += ctx.waited_s
                stats["finish_reasons"].append(gen.finish_reason)
                if gen.finish_reason == "cancelled":
                    break
            if cancel.is_set() and "cancelled" not in stats["finish_reasons"]:
                stats["finish_reasons"].append("cancelled")
            yield _final(chunker, stats, t0)
        finally:
            feed.cancel()  # stops the reader thread (if any) after its piece in flight


def with_speed(chunks: Iterator[AudioChunk], speed: float) -> Iterator[AudioChunk]:
    """``chunks`` time-stretched to ``speed`` while they stream (:mod:`qtts.stretch`); as they are at 1.0."""
    if speed == 1.0:
        return chunks
    from .stretch import stretch_chunks

    return stretch_chunks(chunks, speed)


def _live_frames(gen, chunker: _Chunker, stats: dict, t0: float) -> Iterator[AudioChunk]:
    """One live context's chunks; frames still pending go out as soon as the talker has to wait for text."""
    frames = iter(gen)
    try:
        for codes in frames:
            stats["frames"] += 1
            chunk = chunker.push(codes)
            if chunk is None and gen.waiting():
                chunk = chunker.drain()
            if chunk is not None:
                yield _stamp(chunk, stats, t0)
    finally:
        frames.close()


def _final(chunker: _Chunker, stats: dict, t0: float) -> AudioChunk:
    final = chunker.flush()
    final.is_final = True
    final.finish_reason = worst_reason(stats["finish_reasons"])
    return _stamp(final, stats, t0, final=True)


def _stamp(chunk: AudioChunk, stats: dict, t0: float, final: bool = False) -> AudioChunk:
    now = time.perf_counter() - t0
    if stats["ttfa_s"] is None and len(chunk.samples):
        stats["ttfa_s"] = now
        feed = stats.get("feed")
        if feed is not None and feed.first_piece_at is not None:  # stream_text: from the first text piece
            stats["text_to_audio_s"] = time.perf_counter() - feed.first_piece_at
    info = {"frames": stats["frames"], "wall_s": now, "ttfa_s": stats["ttfa_s"]}
    if "feed" in stats:
        info["text_to_audio_s"] = stats.get("text_to_audio_s")
    if final:
        audio_s = stats["frames"] / FRAME_RATE
        info.update(audio_s=audio_s, rtf=(now / audio_s) if audio_s else None,
                    pieces=stats["pieces"], finish_reasons=list(stats["finish_reasons"]))
        if "feed" in stats:
            info.update(text_wait_s=stats["waited_s"], text_chars=stats["feed"].chars)
    chunk.info = info
    return chunk


class _Chunker:
    """Groups frames: a first chunk of ``first`` frames, then chunks of ``size`` frames."""

    def __init__(self, vocoder, first: int, size: int):
        self.vocoder, self.first, self.size = vocoder, first, size
        self.pending: list[np.ndarray] = []
        self.start = 0
        self.emitted = 0

    def push(self, codes: np.ndarray) -> AudioChunk | None:
        self.pending.append(codes)
        want = self.first if self.emitted == 0 else self.size
        return self._emit() if len(self.pending) >= want else None

    def flush(self) -> AudioChunk:
        return self._emit()

    def drain(self) -> AudioChunk | None:
        """The pending frames as a chunk now (None when there are none)."""
        return self._emit() if self.pending else None

    def _emit(self) -> AudioChunk:
        n = len(self.pending)
        if n:
            samples = np.asarray(self.vocoder.decode(np.stack(self.pending)), dtype=np.float32)
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

