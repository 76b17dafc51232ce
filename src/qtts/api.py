"""Public API: ``qtts.load()`` -> :class:`TTS` with ``stream`` / ``stream_text`` / ``synthesize`` /
``save`` / ``create_voice``.

A thin facade: it checks the input and calls the one synthesis body, :class:`qtts.engine.synth.Synthesis`
(``TTS.synth``): text -> sentence pieces -> prompt -> :class:`~qtts.engine.generate.Generation`
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
from collections.abc import Iterator

from .audio.chunk import Audio, AudioChunk
from .audio.codes import check_codes
from .config import CODEBOOK_SIZE, SAMPLE_RATE
from .engine.stream import collect, with_speed
from .engine.synth import Synthesis, with_timestamps
from .errors import InputError
from .options import SynthesisOptions
from .text.prompt import clean_text, resolve_mode, valid_conditioning
from .voice import Voice, add_trailing_silence, load_reference_audio

log = logging.getLogger(__name__)


def load(model: str, plan=None, dtype: str = "float32", threads: int | None = None, backend=None,
         parts=None, max_batch: int = 1, aligner: str | None = None) -> TTS:
    """Load a snapshot dir or hub id; ``plan`` picks runtimes per component: None = the default
    preset (an ONNX bundle built once per checkpoint and cached, :mod:`qtts.plans.cache`),
    ``"torch"`` = the fp32 reference, a preset name, or a plan path / dict / Plan.

    ``threads`` None picks by model size (:func:`qtts.backends.default_threads`); ``parts`` None
    builds everything, ``("vocoder",)`` only what :meth:`TTS.decode` needs (no talker is loaded).
    ``max_batch`` > 1: concurrent :meth:`TTS.stream` / :meth:`TTS.stream_text` calls share one
    batched generation loop (:mod:`qtts.engine.batching`). ``aligner``: the Qwen3-ForcedAligner snapshot
    (folder or hub id) that times words for ``timestamps=True``; None = ``$QTTS_ALIGNER``, else the
    official one when it is in the local Hugging Face cache (:mod:`qtts.align.runtime`).
    """
    from .backends import open as open_components

    return TTS(open_components(model, plan=plan, dtype=dtype, threads=threads, backend=backend, parts=parts,
                               max_batch=max_batch), aligner=aligner)  # fmt: skip


class TTS:
    """A loaded Qwen3-TTS model over its :class:`~qtts.backends.Components`; see :attr:`thread_safe`.

    With ``max_batch`` > 1 (default: ``components.max_batch``) every :meth:`stream` call, from any
    thread, joins one :class:`~qtts.engine.batching.BatchEngine` that steps all active streams together,
    and their vocoder steps run on one :class:`~qtts.backends.vocoder_batch.VocoderBatcher` thread.
    """

    def __init__(self, components, max_batch: int | None = None, aligner: str | None = None):
        self.components = components
        self.config = components.config
        #: the synthesis runtime every call runs on (:mod:`qtts.engine.synth`)
        self.synth = Synthesis(components, max_batch, _aligner_slot(aligner, components.plan), _vocoder_batcher)
        self.max_batch = self.synth.max_batch
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
            from .plans.plan import codec_fingerprint

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
        return self.synth.batch

    @property
    def vocoder_batch(self):
        """The shared :class:`~qtts.backends.vocoder_batch.VocoderBatcher`, or None (:attr:`Synthesis.vocoder_batch`)."""
        return self.synth.vocoder_batch

    @property
    def aligner(self):
        """The forced aligner's :class:`~qtts.align.runtime.AlignerWorker` (loaded on first use), or None
        when no aligner snapshot was given or found (``timestamps=True`` then times whole pieces)."""
        return self.synth.aligner

    def warm(self) -> None:
        """Pay now what the first request would: the vocoder's steps built and their weights packed
        (the bf16 vocoder: ~2 s; its first audio then comes in ~200 ms instead of ~760, Zen 4 VM).
        ``qtts serve`` and the Ray Serve replicas call it before they report ready."""
        if self.components.vocoder is not None:
            self.components.vocoder.warm()

    def close(self) -> None:
        """Stop the batch engine's, the vocoder batcher's and the aligner's threads (running streams end
        'cancelled'); idempotent."""
        self.synth.close()

    # -- synthesis -----------------------------------------------------------------------------
    def stream(self, text: str, voice: Voice | str | None = None, speaker: str | None = None,
               instruct: str | None = None, language: str | None = None,
               options: SynthesisOptions | None = None, timestamps: bool | None = None) -> Iterator[AudioChunk]:
        """Yield audio chunks while generating; the last one has ``is_final`` and ``finish_reason``.

        Input errors (mode/checkpoint mismatch, unknown speaker or language, empty text) are
        raised at the call, before any chunk. Closing the iterator stops generation at once.
        ``timestamps`` (or ``options.timestamps``): word timings on the chunks (``AudioChunk.words``,
        :mod:`qtts.align.timing`), as each piece's alignment completes; the audio is the same.
        """
        self._need("backend", "generation")
        self._need("vocoder", "vocoder")
        options = with_timestamps(options, timestamps).resolve(self.config.generation)
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.load(os.fspath(voice))
        mode = resolve_mode(self.config, voice, speaker, instruct, language or options.language)
        pieces = self.synth.pieces(text, options)
        return with_speed(self.synth.text(pieces, mode, options), options.speed)

    def stream_text(self, pieces, voice: Voice | str | None = None, speaker: str | None = None,
                    instruct: str | None = None, language: str | None = None,
                    options: SynthesisOptions | None = None, timestamps: bool | None = None):
        """Speak text while it is still being written: ``pieces`` are its parts in order (an LLM's
        deltas), as an iterable, an async iterable, or a :class:`qtts.text.live.TextFeed`.

        Yields :class:`AudioChunk` like :meth:`stream` (an async iterator for an async iterable).
        Text goes to the talker a token at a time as tokens become final; when the talker is
        ahead of the text it waits. With greedy decoding the audio equals ``stream(text,
        split_sentences=False, non_streaming_text=False)`` of the joined text while the text fits
        one talker context (``options.context_frames``); a longer text goes on in a new context
        from a sentence end. ``options.speed`` stretches the audio as in :meth:`stream`.
        Conditioning errors are raised at the call; an empty text when the input ends. Closing
        the iterator stops generation within one frame. ``timestamps``: as in :meth:`stream`, per
        talker context.
        """
        options = with_timestamps(options, timestamps).resolve(self.config.generation)
        if options.non_streaming_text:
            raise InputError("stream_text feeds text as it arrives, which needs the streaming text layout; "
                             "leave non_streaming_text unset (or False)")
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.load(os.fspath(voice))
        mode = resolve_mode(self.config, voice, speaker, instruct, language or options.language)
        from .text.live import TextFeed, astream

        def speak(source, opts: SynthesisOptions) -> Iterator[AudioChunk]:
            return with_speed(self.synth.live(source, mode, opts), opts.speed)

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
        return with_speed(self.synth.decode(codes, prime, options), options.speed)

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


def _aligner_slot(spec: str | None, plan):
    """The aligner slot's factory: found now when ``spec`` names one (a bad one fails at load), else on
    the first ``timestamps=True`` call (a request without timestamps never looks)."""
    if spec:
        from .align.runtime import AlignerSlot

        slot = AlignerSlot(spec, plan)
        return lambda: slot
    return lambda: _found_slot(plan)


def _found_slot(plan):
    from .align.runtime import AlignerSlot

    return AlignerSlot(None, plan)


def _vocoder_batcher(vocoder, max_batch: int):
    from .backends.vocoder_batch import VocoderBatcher

    return VocoderBatcher(vocoder, max_batch)
