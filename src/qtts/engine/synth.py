"""The one synthesis body: options -> loop parameters, the three frame sources, chunks, word timings.

:class:`Synthesis` owns what a :class:`qtts.TTS` runs a request with: the parts
(:class:`~qtts.backends.Components`), the shared batch engine and vocoder batcher (``max_batch`` > 1)
and the forced aligner. Its three bodies are the frame sources of every request:

* :meth:`Synthesis.text`: text pieces -> prompts -> :func:`~qtts.engine.generate.generate` frames
  (on a worker thread with ``options.pipeline``: :func:`~qtts.engine.stream.run_ahead`);
* :meth:`Synthesis.live`: text still arriving (:mod:`qtts.text.live`), one talker context at a time;
* :meth:`Synthesis.decode`: saved frames.

Each runs its frames through :func:`~qtts.engine.stream.chunks` (the stateful streaming vocoder;
pieces join without a seam) and, with ``options.timestamps``, :func:`qtts.align.timing.timestamped`.
``qtts.TTS`` checks the input and calls these; ``qtts bench``, the capacity probe and the perf
scripts call them too (``exact_frames``: every stream runs its ``max_frames``, EOS blocked).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import numpy as np

from ..audio.chunk import AudioChunk
from ..options import AnyCancel, LoopParams, SynthesisOptions, WatchdogParams, frame_budget
from ..text.prompt import build_prompt, clean_text, live_prompt, text_stream
from .generate import generate
from .stream import Chunker, PieceEnd, StreamStats, chunks, closing_frames, run_ahead


class Synthesis:
    """The runtime of one loaded model (module doc); thread-safe where its parts are."""

    def __init__(self, components, max_batch: int | None = None, aligner=None, vocoder_batcher=None):
        """``aligner``: a zero-argument callable that returns the aligner's slot (``get()`` -> the
        :class:`~qtts.align.runtime.AlignerWorker` or None, ``close()``), called on first use; None: no aligner.
        ``vocoder_batcher(vocoder, max_batch)``: makes the shared vocoder batcher
        (:class:`~qtts.backends.vocoder_batch.VocoderBatcher`; the engine imports no runtime itself)."""
        self.components = components
        self.config = components.config
        self.max_batch = int(max_batch or getattr(components, "max_batch", 1) or 1)
        #: benchmarks and probes: every stream runs exactly its max_frames (EOS blocked, no watchdog)
        self.exact_frames = False
        self._aligner_factory = aligner
        self._vocoder_batcher = vocoder_batcher
        self._aligner = None
        self._batch = None
        self._vocoder_batch = None
        self._lock = threading.Lock()

    @property
    def batch(self):
        """The shared :class:`~qtts.engine.batching.BatchEngine` (started on first use), or None when ``max_batch`` is 1."""
        if self.max_batch <= 1:
            return None
        with self._lock:
            if self._batch is None:
                from .batching import BatchEngine

                self._batch = BatchEngine(self.components.backend, self.max_batch)
            return self._batch

    @property
    def vocoder_batch(self):
        """The shared :class:`~qtts.backends.vocoder_batch.VocoderBatcher` (started on first use), or
        None when ``max_batch`` is 1 or the vocoder does not batch."""
        vocoder = self.components.vocoder
        if self.max_batch <= 1 or self._vocoder_batcher is None or not vocoder.batches:
            return None
        with self._lock:
            if self._vocoder_batch is None:
                self._vocoder_batch = self._vocoder_batcher(vocoder, self.max_batch)
            return self._vocoder_batch

    @property
    def aligner(self):
        """The forced aligner's :class:`~qtts.align.runtime.AlignerWorker` (loaded on first use), or None."""
        with self._lock:
            if self._aligner is None and self._aligner_factory is not None:
                self._aligner = self._aligner_factory()
            slot = self._aligner
        return None if slot is None else slot.get()

    def close(self) -> None:
        """Stop the batch engine's, the vocoder batcher's and the aligner's threads; idempotent."""
        with self._lock:
            slot, self._aligner = self._aligner, None
        if slot is not None:
            slot.close()
        with self._lock:
            engine, self._batch = self._batch, None
            vocoders, self._vocoder_batch = self._vocoder_batch, None
        if engine is not None:
            engine.close()
        if vocoders is not None:
            vocoders.close()

    def vocoder(self, prime):
        """A fresh vocoder stream (of the shared batcher when batched), primed with ICL reference codes
        (their audio is discarded)."""
        batcher = self.vocoder_batch
        vocoder = batcher.stream() if batcher is not None else self.components.vocoder.stream()
        if prime is not None and len(prime):
            try:
                vocoder.prime(prime)
            except BaseException:
                release(vocoder)
                raise
        return vocoder

    def pieces(self, text: str, options: SynthesisOptions) -> list[str]:
        text = clean_text(text)
        if not options.split_sentences or len(text) <= options.max_sentence_chars:
            return [text]  # one talker context, as in the official model (and what pack_sentences gives it)
        from ..text.sentences import pack_sentences

        return pack_sentences(text, options.max_sentence_chars) or [text]

    def loop_params(self, max_frames: int, options: SynthesisOptions, index: int, cancel=None) -> LoopParams:
        """The loop parameters of text piece ``index`` (its seed is ``options.seed + index``)."""
        seed = None if options.seed is None else int(options.seed) + index
        exact = self.exact_frames
        return LoopParams.for_config(
            self.config, options.talker, options.predictor, max_frames, seed=seed,
            watchdog=WatchdogParams() if options.watchdog and not exact else None, cancel=cancel or options.cancel,
            **({"min_frames": max_frames} if exact else {}),
        )  # fmt: skip

    def generate(self, prompt, params: LoopParams, speaker, text=None, hold=None):
        """Frames of one prompt (``text``: a live text source): a :class:`~qtts.engine.generate.Generation`,
        or a stream of the shared batch (``hold``: :meth:`~qtts.engine.batching.BatchLoop.add`)."""
        batch = self.batch
        if batch is None:
            return generate(self.components.backend, prompt, params, speaker=speaker, text=text)
        return batch.submit(prompt, params, speaker, text=text, hold=hold)

    def text(self, pieces, mode, options) -> Iterator[AudioChunk]:
        """``TTS.stream``'s body: the frames of every piece through :func:`~qtts.engine.stream.chunks`."""
        stats = StreamStats(pieces=len(pieces))
        piped = options.pipeline and self.max_batch <= 1  # a batch engine's thread already generates ahead
        placement = self.components.placement if piped else None  # qtts.backends.Placement
        chunker = Chunker(self.vocoder(mode.ref_codes if mode.icl else None), options.first_chunk_frames,
                          options.chunk_frames)  # fmt: skip
        batch = self.batch if options.pipeline else None  # a batched stream waits for its first decode too
        first_decoded = batch.first_audio() if batch is not None else threading.Event()
        hold = None if batch is None else (options.first_chunk_frames, first_decoded)
        placed = placement is not None and placement.claim()  # one placed stream at a time; released below
        if placed:
            chunker.place = placement.decoding

        def frames(cancel) -> Iterator[np.ndarray]:  # on the pipeline's worker thread when options.pipeline
            if placed:
                placement.pin_generation()
            for index, piece in enumerate(pieces):
                prompt = build_prompt(self.config, self.components.tokenizer, piece, mode, options.non_streaming_text)
                budget = options.max_frames or frame_budget(prompt.text_token_count,
                                                            cap=int(self.config.generation.max_new_tokens))
                gen = self.generate(prompt, self.loop_params(budget, options, index, cancel), mode.xvector, hold=hold)
                yield from closing_frames(gen)
                stats.finish_reasons.append(gen.finish_reason)
                if gen.finish_reason == "cancelled":
                    return
                if options.timestamps:
                    yield PieceEnd(piece)

        try:
            if piped:
                source = run_ahead(frames, options.cancel, hold=(options.first_chunk_frames, first_decoded))
            else:
                source = frames(options.cancel)
            yield from self.timed(chunks(source, chunker, stats, first_decoded=first_decoded), stats, mode, options)
        finally:
            release(chunker.vocoder)
            if placed:
                placement.release()

    def live(self, source, mode, options) -> Iterator[AudioChunk]:
        """``TTS.stream_text``'s body: the frames of every talker context a :class:`~qtts.text.live.TextFeed`
        opens, through :func:`~qtts.engine.stream.chunks` (module doc of :mod:`qtts.text.live`).
        ``source``: the feed itself, or an iterable that a reader thread pushes into a new feed."""
        from ..text.live import TextFeed, context_limits, start_reader

        parts = self.components
        feed = source if isinstance(source, TextFeed) else TextFeed(parts.tokenizer)
        if feed is not source:
            start_reader(source, feed)
        cancel = AnyCancel(options.cancel, feed)
        cap = options.max_frames or min(options.context_frames, int(self.config.generation.max_new_tokens))
        max_tokens, budget = context_limits(cap, options.max_frames)
        text = text_stream(self.config, parts.tokenizer, mode)
        stats = StreamStats(pieces=0, feed=feed)
        chunker = Chunker(self.vocoder(mode.ref_codes if mode.icl else None), options.first_chunk_frames,
                          options.chunk_frames)  # fmt: skip
        current: list = [None]
        batch = self.batch  # as in text(): a batched stream's talker waits for its first decode
        first_decoded = batch.first_audio() if batch is not None else None
        hold = None if batch is None else (options.first_chunk_frames, first_decoded)

        def frames() -> Iterator[np.ndarray]:
            while (ctx := feed.next_context(text, parts.backend, max_tokens, budget, cancel)) is not None:
                prompt = live_prompt(self.config, parts.tokenizer, mode, ctx.prefill_body())
                gen = current[0] = self.generate(prompt, self.loop_params(cap, options, stats.pieces, cancel),
                                                  mode.xvector, text=ctx, hold=hold)  # fmt: skip
                yield from closing_frames(gen)
                ctx.end(gen.finish_reason)
                if options.timestamps and gen.finish_reason != "cancelled":
                    yield PieceEnd(ctx.spoken_text())
                stats.pieces += 1
                stats.waited_s += ctx.waited_s
                stats.finish_reasons.append(gen.finish_reason)
                if gen.finish_reason == "cancelled":
                    break
            if cancel.is_set() and "cancelled" not in stats.finish_reasons:
                stats.finish_reasons.append("cancelled")

        try:
            yield from self.timed(chunks(frames(), chunker, stats, waiting=lambda: current[0].waiting(),
                                         first_decoded=first_decoded), stats, mode, options)  # fmt: skip
        finally:
            feed.cancel()  # stops the reader thread (if any) after its piece in flight
            release(chunker.vocoder)

    def timed(self, stream: Iterator[AudioChunk], stats: StreamStats, mode, options) -> Iterator[AudioChunk]:
        """``stream`` with word timings (:func:`qtts.align.timing.timestamped`) when ``options.timestamps``."""
        if not options.timestamps:
            return stream
        from ..align.timing import timestamped

        return timestamped(stream, stats, self.aligner, mode.language, options.speed)

    def decode(self, codes: np.ndarray, prime, options) -> Iterator[AudioChunk]:
        chunker = Chunker(self.vocoder(prime), options.first_chunk_frames, options.chunk_frames)
        try:
            yield from chunks(iter(codes), chunker, StreamStats())
        finally:
            release(chunker.vocoder)


def with_timestamps(options: SynthesisOptions | None, timestamps: bool | None) -> SynthesisOptions:
    """``options`` with ``timestamps`` set when the call names it."""
    options = options or SynthesisOptions()
    return options if timestamps is None else dataclasses.replace(options, timestamps=bool(timestamps))


def release(vocoder) -> None:
    """The utterance is over: a batched vocoder stream gives its place back (plain streams: nothing)."""
    vocoder.close()
