"""Public API: ``qtts.load()`` -> :class:`TTS` with ``stream`` / ``synthesize`` / ``save`` / ``create_voice``.

``stream()`` is the one body: text -> sentence pieces -> prompt -> :class:`~qtts.generate.Generation`
frames -> the stateful streaming vocoder -> :class:`~qtts.audio.AudioChunk`. The first chunk is
decoded after ``first_chunk_frames`` frames, later ones every ``chunk_frames`` frames; the
vocoder state continues across sentence pieces, so pieces join without a seam. Everything else
consumes ``stream()``. The parts it runs on come from :func:`qtts.backends.open`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import numpy as np

from .audio import Audio, AudioChunk
from .config import FRAME_RATE, SAMPLE_RATE
from .errors import InputError
from .generate import LoopParams, WatchdogParams, frame_budget, generate
from .options import SynthesisOptions
from .prompt import build_prompt, clean_text, resolve_mode, valid_conditioning
from .voice import Voice, add_trailing_silence, load_reference_audio

log = logging.getLogger(__name__)


def load(model: str, plan=None, dtype: str = "float32", threads: int | None = None, backend=None,
         max_batch: int = 1) -> TTS:
    """Load a snapshot dir or hub id; ``plan`` (path, dict or Plan) picks runtimes per component.

    ``threads`` None picks by model size (:func:`qtts.backends.default_threads`). ``max_batch`` > 1:
    concurrent :meth:`TTS.stream` calls share one batched generation loop (:mod:`qtts.batching`).
    """
    from .backends import open as open_components

    parts = open_components(model, plan=plan, dtype=dtype, threads=threads, backend=backend, max_batch=max_batch)
    return TTS(parts)


class TTS:
    """A loaded Qwen3-TTS model over its :class:`~qtts.backends.Components`; see :attr:`thread_safe`.

    With ``max_batch`` > 1 (default: ``components.max_batch``) every :meth:`stream` call, from any
    thread, joins one :class:`~qtts.batching.BatchEngine` that steps all active streams together;
    each call's vocoder still runs on the calling thread.
    """

    def __init__(self, components, max_batch: int | None = None):
        self.components = components
        self.config = components.config
        self.max_batch = int(max_batch or getattr(components, "max_batch", 1) or 1)
        self._batch = None
        self._batch_lock = threading.Lock()

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

        Always with ``max_batch`` > 1 (one engine thread drives the backend). Otherwise per-call
        state (talker KV, vocoder state, random generator) lives in each call and the backend
        decides the rest by declaring ``thread_safe = True`` (the torch backend does).
        """
        return self.max_batch > 1 or self.components.thread_safe

    @property
    def batch(self):
        """The shared :class:`~qtts.batching.BatchEngine` (started on first use), or None when ``max_batch`` is 1."""
        if self.max_batch <= 1:
            return None
        with self._batch_lock:
            if self._batch is None:
                from .batching import BatchEngine

                self._batch = BatchEngine(self.components.backend, self.max_batch)
            return self._batch

    def close(self) -> None:
        """Stop the batch engine's thread (running streams end 'cancelled'); idempotent."""
        with self._batch_lock:
            engine, self._batch = self._batch, None
        if engine is not None:
            engine.close()

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
        chunks = self._stream(pieces, mode, options)
        if options.speed != 1.0:
            from .stretch import stretch_chunks

            chunks = stretch_chunks(chunks, options.speed)
        return chunks

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

    def _loop_params(self, num_ids: int, options: SynthesisOptions, index: int) -> LoopParams:
        cap = int(self.config.generation.max_new_tokens)
        max_frames = options.max_frames or frame_budget(num_ids, cap=cap)
        seed = None if options.seed is None else int(options.seed) + index
        return LoopParams.for_config(
            self.config, options.talker, options.predictor, max_frames, seed=seed,
            watchdog=WatchdogParams() if options.watchdog else None, cancel=options.cancel,
        )  # fmt: skip

    def _generate(self, prompt, params: LoopParams, speaker):
        """Frames of one prompt: a :class:`~qtts.generate.Generation`, or a stream of the shared batch."""
        batch = self.batch
        if batch is None:
            return generate(self.components.backend, prompt, params, speaker=speaker)
        return batch.submit(prompt, params, speaker)

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
            gen = self._generate(prompt, self._loop_params(prompt.text_token_count, options, index), mode.xvector)
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

