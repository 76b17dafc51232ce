"""Public API: ``qtts.load()`` -> :class:`TTS` with ``stream`` / ``stream_text`` / ``synthesize`` /
``save`` / ``create_voice``.

``stream()`` is the one body: text -> sentence pieces -> prompt -> :class:`~qtts.engine.generate.Generation`
frames -> the stateful streaming vocoder -> :class:`~qtts.audio.AudioChunk`. The first chunk is
decoded after ``first_chunk_frames`` frames, later chunks double in size up to ``chunk_frames``;
the vocoder state continues across sentence pieces, so pieces join without a seam. With
``options.pipeline`` (default) the frames are generated on a worker thread while this thread
decodes (:mod:`qtts.engine.stream`): the same chunks, the same audio. Everything else
consumes ``stream()``. ``stream_text()`` is the same body over text that is still arriving
(:mod:`qtts.text.live`): one talker context across sentences, the same chunking and vocoder stream.
Every chunk carries the codec frames it was decoded from (``AudioChunk.codes``);
:meth:`TTS.decode_stream` feeds saved frames through the same chunker and vocoder priming, so the
same frames, voice prime and chunk sizes give the same audio. The parts it runs on come from
:func:`qtts.backends.open`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

import numpy as np

from .audio.chunk import Audio, AudioChunk
from .audio.codes import check_codes
from .config import CODEBOOK_SIZE, SAMPLE_RATE
from .engine.generate import AnyCancel, LoopParams, WatchdogParams, frame_budget, generate
from .engine.stream import Chunker, StreamStats, chunks, closing_frames, collect, run_ahead, with_speed
from .errors import InputError
from .options import SynthesisOptions
from .text.prompt import build_prompt, clean_text, live_prompt, resolve_mode, text_stream, valid_conditioning
from .voice import Voice, add_trailing_silence, load_reference_audio

log = logging.getLogger(__name__)


def load(model: str, plan=None, dtype: str = "float32", threads: int | None = None, backend=None,
         parts=None, max_batch: int = 1) -> TTS:
    """Load a snapshot dir or hub id; ``plan`` picks runtimes per component: None = the default
    preset (an ONNX bundle built once per checkpoint and cached, :mod:`qtts.backends.cache`),
    ``"torch"`` = the fp32 reference, a preset name, or a plan path / dict / Plan.

    ``threads`` None picks by model size (:func:`qtts.backends.default_threads`); ``parts`` None
    builds everything, ``("vocoder",)`` only what :meth:`TTS.decode` needs (no talker is loaded).
    ``max_batch`` > 1: concurrent :meth:`TTS.stream` / :meth:`TTS.stream_text` calls share one
    batched generation loop (:mod:`qtts.engine.batching`).
    """
    from .backends import open as open_components

    return TTS(open_components(model, plan=plan, dtype=dtype, threads=threads, backend=backend, parts=parts,
                               max_batch=max_batch))  # fmt: skip


class TTS:
    """A loaded Qwen3-TTS model over its :class:`~qtts.backends.Components`; see :attr:`thread_safe`.

    With ``max_batch`` > 1 (default: ``components.max_batch``) every :meth:`stream` call, from any
    thread, joins one :class:`~qtts.engine.batching.BatchEngine` that steps all active streams together,
    and their vocoder steps run on one :class:`~qtts.backends.vocoder_batch.VocoderBatcher` thread.
    """

    def __init__(self, components, max_batch: int | None = None):
        self.components = components
        self.config = components.config
        self.max_batch = int(max_batch or getattr(components, "max_batch", 1) or 1)
        self._batch = None
        self._vocoder_batch = None
        self._batch_lock = threading.Lock()
        self._codec: str | None = None

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
    def codec(self) -> str | None:
        """The speech tokenizer's fingerprint (codes files record it; None: no snapshot directory)."""
        snapshot = getattr(self.components, "snapshot", None)
        if self._codec is None and snapshot is not None:
            from .backends.bundle import codec_fingerprint

            self._codec = codec_fingerprint(snapshot)
        return self._codec

    @property
    def thread_safe(self) -> bool:
        """True when concurrent ``stream()`` calls from several threads are safe on this object.

        Always with ``max_batch`` > 1 (one engine thread drives the backend). Otherwise per-call
        state (talker KV, vocoder state, random generator) lives in each call and the backend
        decides the rest by declaring ``thread_safe = True`` (the torch backend does).
        """
        return self.max_batch > 1 or self.components.thread_safe

    @property
    def batch(self):
        """The shared :class:`~qtts.engine.batching.BatchEngine` (started on first use), or None when ``max_batch`` is 1."""
        if self.max_batch <= 1:
            return None
        with self._batch_lock:
            if self._batch is None:
                from .engine.batching import BatchEngine

                self._batch = BatchEngine(self.components.backend, self.max_batch)
            return self._batch

    @property
    def vocoder_batch(self):
        """The shared :class:`~qtts.backends.vocoder_batch.VocoderBatcher` (started on first use), or
        None when ``max_batch`` is 1 or the vocoder is not a fixed-step one."""
        vocoder = self.components.vocoder
        if self.max_batch <= 1 or not hasattr(vocoder, "run_batch"):
            return None
        with self._batch_lock:
            if self._vocoder_batch is None:
                from .backends.vocoder_batch import VocoderBatcher

                self._vocoder_batch = VocoderBatcher(vocoder, self.max_batch)
            return self._vocoder_batch

    def close(self) -> None:
        """Stop the batch engine's and the vocoder batcher's threads (running streams end
        'cancelled'); idempotent."""
        with self._batch_lock:
            engine, self._batch = self._batch, None
            vocoders, self._vocoder_batch = self._vocoder_batch, None
        if engine is not None:
            engine.close()
        if vocoders is not None:
            vocoders.close()

    # -- synthesis -----------------------------------------------------------------------------
    def stream(self, text: str, voice: Voice | str | None = None, speaker: str | None = None,
               instruct: str | None = None, language: str | None = None,
               options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """Yield audio chunks while generating; the last one has ``is_final`` and ``finish_reason``.

        Input errors (mode/checkpoint mismatch, unknown speaker or language, empty text) are
        raised at the call, before any chunk. Closing the iterator stops generation at once.
        """
        self._need("backend", "generation")
        self._need("vocoder", "vocoder")
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
        deltas), as an iterable, an async iterable, or a :class:`qtts.text.live.TextFeed`.

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
        from .text.live import TextFeed, astream

        def speak(source, opts: SynthesisOptions) -> Iterator[AudioChunk]:
            return with_speed(self._stream_live(source, mode, opts), opts.speed)

        if hasattr(pieces, "__aiter__"):
            return astream(pieces, self.components.tokenizer, speak, options)
        if not isinstance(pieces, TextFeed) and not hasattr(pieces, "__iter__"):
            raise InputError(f"stream_text takes an iterable of strings, got {type(pieces).__name__}")
        return speak(pieces, options)

    def synthesize(self, text: str, **kwargs) -> Audio:
        """The whole utterance (consumes :meth:`stream`), with its frames in ``Audio.codes``."""
        return collect(self.stream(text, **kwargs))

    def decode_stream(self, codes, prime=None, options: SynthesisOptions | None = None,
                      codec: str | None = None) -> Iterator[AudioChunk]:
        """Vocode saved frames ``[frames, 16]`` in streaming chunks, as :meth:`stream` decodes them.

        ``prime``: the reference codes :meth:`stream` primed the vocoder with: ``voice.ref_codes``
        of an ICL voice (one made with ``ref_text``), else None. ``options``: only
        ``first_chunk_frames`` / ``chunk_frames`` / ``speed`` apply. The same frames, prime, chunk
        sizes and speed give the same audio as the :meth:`stream` call that made them. ``codec``:
        the :attr:`codec` the frames were made with (a codes file records it), checked against
        this checkpoint's. Bad codes (shape, type, range, codec) raise InputError at the call.
        """
        self._need("vocoder", "vocoder")
        options = options or SynthesisOptions()
        options.validate()
        if codec is not None and self.codec is not None and codec != self.codec:
            raise InputError(f"these codes were made with another speech tokenizer (codec {codec}) than this "
                             f"checkpoint's (codec {self.codec}); decode them with the checkpoint that made them "
                             "(any checkpoint sharing its speech_tokenizer/ decodes them the same)")
        tokenizer = self.config.speech_tokenizer
        size = int(tokenizer.decoder_config.codebook_size) if tokenizer is not None else CODEBOOK_SIZE
        codes = check_codes(codes, "codes", size)
        prime = None if prime is None else check_codes(prime, "prime", size, allow_empty=True)
        return with_speed(self._decode(codes, prime, options), options.speed)

    def decode(self, codes, prime=None, options: SynthesisOptions | None = None, codec: str | None = None) -> Audio:
        """The whole audio of saved frames (consumes :meth:`decode_stream`)."""
        return collect(self.decode_stream(codes, prime=prime, options=options, codec=codec))

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
        self._need("speaker_encoder", "speaker_encoder")
        if ref_text is not None:
            self._need("speech_encoder", "speech_encoder")
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
    def _need(self, attr: str, part: str):
        if getattr(self.components, attr) is None:
            raise InputError(f"this TTS was loaded without the {part}; load it with parts=None (everything) "
                             f"or parts that include '{part}'")

    def _vocoder(self, prime):
        """A fresh vocoder stream (of the shared batcher when batched), primed with ICL reference codes
        (their audio is discarded)."""
        batcher = self.vocoder_batch
        vocoder = batcher.stream() if batcher is not None else self.components.vocoder.stream()
        if prime is not None and len(prime):
            try:
                getattr(vocoder, "prime", vocoder.decode)(prime)
            except BaseException:
                _release(vocoder)
                raise
        return vocoder

    def _pieces(self, text: str, options: SynthesisOptions) -> list[str]:
        text = clean_text(text)
        if not options.split_sentences or len(text) <= options.max_sentence_chars:
            return [text]  # one talker context, as in the official model (and what pack_sentences gives it)
        from .text.sentences import pack_sentences

        return pack_sentences(text, options.max_sentence_chars) or [text]

    def _loop_params(self, max_frames: int, options: SynthesisOptions, index: int, cancel=None) -> LoopParams:
        seed = None if options.seed is None else int(options.seed) + index
        return LoopParams.for_config(
            self.config, options.talker, options.predictor, max_frames, seed=seed,
            watchdog=WatchdogParams() if options.watchdog else None, cancel=cancel or options.cancel,
        )  # fmt: skip

    def _generate(self, prompt, params: LoopParams, speaker, text=None):
        """Frames of one prompt (``text``: a live text source): a :class:`~qtts.engine.generate.Generation`,
        or a stream of the shared batch."""
        batch = self.batch
        if batch is None:
            return generate(self.components.backend, prompt, params, speaker=speaker, text=text)
        return batch.submit(prompt, params, speaker, text=text)

    def _stream(self, pieces, mode, options) -> Iterator[AudioChunk]:
        """:meth:`stream`'s body: the frames of every piece through :func:`~qtts.engine.stream.chunks`."""
        stats = StreamStats(pieces=len(pieces))
        chunker = Chunker(self._vocoder(mode.ref_codes if mode.icl else None), options.first_chunk_frames,
                          options.chunk_frames)  # fmt: skip

        def frames(cancel) -> Iterator[np.ndarray]:  # on the pipeline's worker thread when options.pipeline
            for index, piece in enumerate(pieces):
                prompt = build_prompt(self.config, self.components.tokenizer, piece, mode, options.non_streaming_text)
                budget = options.max_frames or frame_budget(prompt.text_token_count,
                                                            cap=int(self.config.generation.max_new_tokens))
                gen = self._generate(prompt, self._loop_params(budget, options, index, cancel), mode.xvector)
                yield from closing_frames(gen)
                stats.finish_reasons.append(gen.finish_reason)
                if gen.finish_reason == "cancelled":
                    return

        first_decoded = threading.Event()
        if options.pipeline and self.max_batch <= 1:  # a batch engine's thread already generates ahead
            source = run_ahead(frames, options.cancel, hold=(options.first_chunk_frames, first_decoded))
        else:
            source = frames(options.cancel)
        try:
            yield from chunks(source, chunker, stats, first_decoded=first_decoded)
        finally:
            _release(chunker.vocoder)

    def _stream_live(self, source, mode, options) -> Iterator[AudioChunk]:
        """:meth:`stream_text`'s body: the frames of every talker context a :class:`~qtts.text.live.TextFeed`
        opens, through :func:`~qtts.engine.stream.chunks` (module doc of :mod:`qtts.text.live`).
        ``source``: the feed itself, or an iterable that a reader thread pushes into a new feed."""
        from .text.live import TextFeed, context_limits, start_reader

        parts = self.components
        feed = source if isinstance(source, TextFeed) else TextFeed(parts.tokenizer)
        if feed is not source:
            start_reader(source, feed)
        cancel = AnyCancel(options.cancel, feed)
        cap = options.max_frames or min(options.context_frames, int(self.config.generation.max_new_tokens))
        max_tokens, budget = context_limits(cap, options.max_frames)
        text = text_stream(self.config, parts.tokenizer, mode)
        stats = StreamStats(pieces=0, feed=feed)
        chunker = Chunker(self._vocoder(mode.ref_codes if mode.icl else None), options.first_chunk_frames,
                          options.chunk_frames)  # fmt: skip
        current: list = [None]

        def frames() -> Iterator[np.ndarray]:
            while (ctx := feed.next_context(text, parts.backend, max_tokens, budget, cancel)) is not None:
                prompt = live_prompt(self.config, parts.tokenizer, mode, ctx.prefill_body())
                gen = current[0] = self._generate(prompt, self._loop_params(cap, options, stats.pieces, cancel),
                                                  mode.xvector, text=ctx)  # fmt: skip
                yield from closing_frames(gen)
                ctx.end(gen.finish_reason)
                stats.pieces += 1
                stats.waited_s += ctx.waited_s
                stats.finish_reasons.append(gen.finish_reason)
                if gen.finish_reason == "cancelled":
                    break
            if cancel.is_set() and "cancelled" not in stats.finish_reasons:
                stats.finish_reasons.append("cancelled")

        try:
            yield from chunks(frames(), chunker, stats, waiting=lambda: current[0].waiting())
        finally:
            feed.cancel()  # stops the reader thread (if any) after its piece in flight
            _release(chunker.vocoder)

    def _decode(self, codes: np.ndarray, prime, options) -> Iterator[AudioChunk]:
        chunker = Chunker(self._vocoder(prime), options.first_chunk_frames, options.chunk_frames)
        try:
            yield from chunks(iter(codes), chunker, StreamStats())
        finally:
            _release(chunker.vocoder)


def _release(vocoder) -> None:
    """Give a batched vocoder stream's place back (plain streams have no ``close``)."""
    close = getattr(vocoder, "close", None)
    if close is not None:
        close()
