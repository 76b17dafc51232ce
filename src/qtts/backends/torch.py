"""The torch runtime: everything that runs ``qtts.model`` modules.

* generation: :class:`TorchBackend` (static KV buffers: one talker cache per generation, one
  reused 17-slot predictor cache per thread, so concurrent generations do not interfere; fp32 or
  bf16 weights; embeddings cross the seam as float32 numpy);
* vocoder: :class:`TorchVocoder` (the stateful :class:`~qtts.model.vocoder_step.VocoderStep`: fp32
  exact-size steps or bf16 packed ones, built lazily, shared by every stream) or :class:`TorchFullVocoder`
  (re-decodes the whole prefix: the exact reference, O(n^2));
* encoders: :class:`TorchSpeakerEncoder` (numpy log-mel + ECAPA), :class:`TorchSpeechEncoder`.

Checkpoint components are loaded once per :func:`qtts.backends.open` (:func:`load_part`).
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from ..config import PREDICTOR_STEPS
from ..errors import BUNDLE_HINT, InputError, missing

try:  # this module is imported only when a plan names the torch runtime (qtts.backends._runtime)
    import torch
except ImportError as exc:  # a core-only install
    raise missing("torch", "torch", "the torch runtime", also=BUNDLE_HINT) from exc

from ..model.vocoder_step_bf16 import VocoderStepBF16, step_sizes
from .base import Backend, OpenContext, Vocoder, VocoderStream
from .vocoder_step import StepContract, StepVocoder, rope_freqs

log = logging.getLogger(__name__)

_DTYPES = ("float32", "bfloat16")
VOCODER_PRECISIONS = ("fp32", "bf16")
_MAIN_DTYPE = ("talker", "speaker_encoder")  # the speech tokenizer (decoder, encoder) stays fp32


def torch_dtype(name: str):
    if name not in _DTYPES:
        raise InputError(f"dtype '{name}' is not supported; valid: {', '.join(_DTYPES)}")
    return getattr(torch, name)


def load_part(ctx: OpenContext, name: str):
    """The torch module of checkpoint component ``name`` (talker, speaker_encoder, decoder, encoder).

    Loaded once per context. The speech tokenizer stays fp32 whatever the talker dtype: bf16
    vocoders are where peers found NaN/noise, and it is a small share of the time.
    """
    key = ("torch", name)
    if key not in ctx.cache:
        from ..model.checkpoint import load_dir

        dtype = torch_dtype(ctx.dtype if name in _MAIN_DTYPE else "float32")
        ckpt = load_dir(ctx.snapshot, dtype=dtype, components=(name,), config=ctx.config)
        root = ckpt.model if name in _MAIN_DTYPE else ckpt.speech_tokenizer
        ctx.cache[key] = getattr(root, name)
    return ctx.cache[key]


# ----------------------------------------------------------------------------- generation
class TorchBackend(Backend):
    """Talker + predictor in torch; implements :class:`~qtts.backends.base.Backend`."""

    #: concurrent generations are safe: modules are stateless, KV state is per call, the
    #: predictor cache is per thread
    thread_safe = True

    def __init__(self, talker, threads: int | None = None):
        if threads:
            torch.set_num_threads(int(threads))
        self._torch = torch
        self.talker_module = talker.eval()
        self.predictor = talker.code_predictor
        self.hidden_size = int(talker.cfg.hidden_size)
        ref = talker.codec_head.weight
        self.dtype, self.device = ref.dtype, ref.device
        self._local = threading.local()  # one predictor cache per thread: concurrent streams are safe

    def _ids(self, ids) -> object:
        return self._torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)

    def _out(self, t) -> np.ndarray:
        return t.detach().float().cpu().numpy()

    def text_embeds(self, ids: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            return self._out(self.talker_module.embed_text(self._ids(ids)))

    def codec_embeds(self, ids: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            return self._out(self.talker_module.embed_codec(self._ids(ids)))

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray:
        """Sum of the 16 codebook embeddings per frame (stacked then summed, as the official code)."""
        codes = self._ids(codes)
        with self._torch.inference_mode():
            parts = [self.talker_module.embed_codec(codes[:, 0])]
            parts += [self.predictor.embed(j, codes[:, j + 1]) for j in range(codes.shape[1] - 1)]
            return self._out(self._torch.stack(parts, dim=1).sum(1))

    def new_state(self, max_len: int):
        return self.talker_module.new_cache(int(max_len))

    def talker(self, embeds: np.ndarray, pos: int, state):
        torch = self._torch
        x = torch.as_tensor(np.asarray(embeds, dtype=np.float32), device=self.device)
        with torch.inference_mode():
            logits, hidden, state = self.talker_module(x[None].to(self.dtype), int(pos), state)
            return self._out(logits[0, -1]), self._out(hidden[0, -1]), state

    def predictor_logits(self, hidden, code0: int, sampler, uniforms):
        """(codes [15], logits [15, vocab]) of one frame, for ``qtts verify plan``."""
        heads: list = []
        codes = self.predict_frame(hidden, code0, sampler, uniforms, heads)
        return codes, np.stack(heads)

    def predict_frame(self, hidden: np.ndarray, code0: int, sampler, uniforms: np.ndarray, heads=None) -> np.ndarray:
        """``heads``: a list that gets each step's logits."""
        torch = self._torch
        h = torch.as_tensor(np.asarray(hidden, dtype=np.float32), device=self.device).to(self.dtype)
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self.predictor.new_cache(17)

        def step_logits(j: int, code: int) -> np.ndarray:
            nonlocal cache
            ids = self._ids([[code]])
            if j == 0:
                x, pos = torch.cat([h.view(1, 1, -1), self.talker_module.embed_codec(ids)], dim=1), 0
            else:
                x, pos = self.predictor.embed(j - 1, ids), j + 1
            out, cache = self.predictor(x, pos, cache)
            logits = self._out(self.predictor.head(j, out[0, -1]))
            if heads is not None:
                heads.append(logits)
            return logits

        with torch.inference_mode():
            codes = sampler.frame(step_logits, code0, uniforms)
        self._local.cache = cache
        return codes


    # -- many streams (a scheduler's batch step) ---------------------------------------------
    def talker_rows(self, embeds: np.ndarray, positions: list, states: list):
        """One talker step for ``B`` streams, each at its own position with its own cache."""
        torch = self._torch
        x = torch.as_tensor(np.asarray(embeds, dtype=np.float32), device=self.device)[:, None]
        with torch.inference_mode(), _row_linear():
            logits, hidden = self.talker_module.forward_rows(x.to(self.dtype), [int(p) for p in positions], states)
            return self._out(logits[:, -1]), self._out(hidden[:, -1]), states

    def release(self, state) -> None:
        """Nothing to give back: each stream's KV cache is its own (the batch seam's third method)."""

    def predict_frames(self, hidden: np.ndarray, code0: np.ndarray, samplers: list, uniforms: np.ndarray) -> np.ndarray:
        """The predictor's 15 codes for ``B`` streams in one batched frame -> ``[B, 15]``."""
        torch = self._torch
        h = torch.as_tensor(np.asarray(hidden, dtype=np.float32), device=self.device).to(self.dtype)
        cache = self.predictor.new_cache(17, batch=len(code0))

        def step_logits(j: int, codes: np.ndarray) -> np.ndarray:
            nonlocal cache
            ids = self._ids(codes)[:, None]  # [B, 1]
            if j == 0:
                x, pos = torch.cat([h[:, None], self.talker_module.embed_codec(ids)], dim=1), 0
            else:
                x, pos = self.predictor.embed(j - 1, ids), j + 1
            out, cache = self.predictor(x, pos, cache)
            return self._out(self.predictor.head(j, out[:, -1]))

        with torch.inference_mode(), _row_linear():
            return _sample_rows(step_logits, code0, samplers, uniforms)


def _row_linear():
    """The batch-invariant linear mode of the batch seam (imported when a batched engine first steps)."""
    from .torch_rows import RowLinear

    return RowLinear()


def _sample_rows(step_logits, code0: np.ndarray, samplers: list, uniforms: np.ndarray) -> np.ndarray:
    """``PredictorSampler.frame`` for ``B`` streams at once: ``step_logits(j, codes [B])`` returns
    logits ``[B, 2048]``; each row is sampled with its own sampler and uniforms -> codes ``[B, 15]``."""
    rows = len(code0)
    codes = np.zeros((rows, PREDICTOR_STEPS), dtype=np.int64)
    prev = np.asarray(code0, dtype=np.int64)
    for j in range(PREDICTOR_STEPS):
        logits = step_logits(j, prev)
        for b in range(rows):
            codes[b, j] = samplers[b].pick(logits[b], float(uniforms[b, j]))
        prev = codes[:, j]
    return codes


# ----------------------------------------------------------------------------- vocoder
class TorchVocoder(StepVocoder):
    """VocoderStep in torch: ``main``-frame steps, then a remainder in one exact-size step (bf16: in
    steps of :attr:`sizes`); nothing is padded. Steps, built lazily (or by :meth:`warm`), share the
    decoder weights and the folded constants and serve every stream (their state is explicit)."""

    exact_remainder = True

    def __init__(self, decoder, main: int = 16, threads: int | None = None, stack_streams: bool = False,
                 precision: str = "fp32"):  # fmt: skip
        """``stack_streams``: :meth:`run_batch` runs several streams' steps as one vectorized call
        (``torch.func.vmap``; equal to alone to fp32 rounding, not bitwise); else one by one.
        ``precision``: "fp32" (:class:`~qtts.model.vocoder_step.VocoderStep`) or "bf16" (:class:`VocoderStepBF16`,
        SnakeBeta from qtts.kernels where the library is built)."""
        self._torch = torch
        self.stack_streams = bool(stack_streams)
        if precision not in VOCODER_PRECISIONS:
            raise InputError(f"vocoder precision '{precision}' is not supported; valid: {', '.join(VOCODER_PRECISIONS)}")
        if precision == "bf16" and self.stack_streams:
            raise InputError("stack_streams runs fp32 steps only; drop it or use precision fp32")
        self.precision = precision
        dtype = next(decoder.parameters()).dtype
        if dtype != self._torch.float32:
            raise InputError(f"the streaming vocoder step runs in float32 (its state is an fp32 tensor), but the decoder "
                             f"weights are {dtype}; load the speech tokenizer in float32 "
                             "(load_checkpoint(..., speech_tokenizer_dtype=torch.float32))")  # fmt: skip
        self.decoder = decoder.eval()
        self.threads = threads
        self._steps: dict = {}
        self._lock = threading.Lock()
        self._main = int(main)
        #: bf16: main and the powers of two below it, each packed (step_sizes: no slow unpacked step)
        self.sizes = step_sizes(self._main) if precision == "bf16" else [self._main]
        probe = self.step(int(main))
        self.contract = StepContract(
            int(main), probe.cache_size, decoder.config.head_dim, probe.layout.kv_slots,
            probe.samples_per_frame, tuple(float(x) for x in probe.inv_freq()), decoder.config.num_quantizers,
        )  # fmt: skip

    def step(self, size: int):
        """The :class:`~qtts.model.vocoder_step.VocoderStep` of ``size`` frames (built once)."""
        with self._lock:
            if size not in self._steps:
                like = next(iter(self._steps.values()), None)
                self._steps[size] = self._new_step(size, like).eval()
            return self._steps[size]

    def _new_step(self, size: int, like):
        if self.precision == "bf16":
            from ..kernels import snake_rows

            # the convolutions packed for every size a chunk decodes in (self.sizes), the
            # pre-transformer's linears for the first frame's step and the main one
            return VocoderStepBF16(self.decoder, size, like=like, snake=snake_rows, pack=size in self.sizes,
                                   pack_linears=size in (1, self._main))
        from ..model.vocoder_step import VocoderStep

        return VocoderStep(self.decoder, size, like=like)

    def run(self, size, codes, freqs, valid, cache):
        torch = self._torch
        step = self.step(size)
        prev = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                args = (torch.from_numpy(codes), torch.from_numpy(freqs), torch.from_numpy(valid))
                audio, cache = step(*args, torch.from_numpy(cache))
        finally:
            torch.set_num_threads(prev)
        return audio.float().numpy(), cache.float().numpy()

    def run_batch(self, size, codes, freqs, valid, cache):
        if not self.stack_streams:
            return super().run_batch(size, codes, freqs, valid, cache)
        torch = self._torch
        prev = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                args = [torch.from_numpy(np.ascontiguousarray(x)) for x in (codes, freqs, valid, cache)]
                audio, cache = torch.func.vmap(self.step(size))(*args)
        finally:
            torch.set_num_threads(prev)
        return audio.float().numpy(), cache.float().numpy()


class TorchFullVocoder(Vocoder):
    """The offline decoder re-run over the whole prefix on every call (exact reference)."""

    def __init__(self, decoder):
        self._torch = torch
        self.decoder = decoder.eval()

    def stream(self) -> _FullStream:
        return _FullStream(self)


class _FullStream(VocoderStream):
    def __init__(self, vocoder: TorchFullVocoder):
        self.vocoder = vocoder
        self.samples_per_frame = vocoder.decoder.samples_per_frame
        self.reset()

    def reset(self) -> None:
        self._codes = np.zeros((0, self.vocoder.decoder.config.num_quantizers), dtype=np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.int64)
        done = len(self._codes) * self.samples_per_frame
        self._codes = np.concatenate([self._codes, codes])
        if not len(codes):
            return np.zeros(0, dtype=np.float32)
        torch = self.vocoder._torch
        with torch.inference_mode():
            wav = self.vocoder.decoder(torch.from_numpy(self._codes.T[None].copy()))
        return wav.reshape(-1).float().numpy()[done:]


def step_decode(step_for, codes, schedule: list[int]) -> np.ndarray:
    """Decode ``codes [1,16,T]`` (torch) with VocoderSteps of the sizes in ``schedule`` (sum == T);
    ``step_for(B)`` returns a step. Used by ``qtts verify vocoder`` and the tests."""
    if sum(schedule) != codes.shape[-1]:
        raise ValueError(f"schedule sums to {sum(schedule)}, codes have {codes.shape[-1]} frames")
    cache, pos, outs = None, 0, []
    with torch.no_grad():
        for b in schedule:
            step = step_for(b)
            cache = step.init_cache() if cache is None else cache
            freqs = torch.from_numpy(rope_freqs(pos, b, step.inv_freq()))
            wav, cache = step(codes[:, :, pos : pos + b], freqs, step.cache_valid(pos), cache)
            outs.append(wav.numpy())
            pos += b
    return np.concatenate(outs)


# ----------------------------------------------------------------------------- encoders
class TorchSpeakerEncoder:
    """x-vector ``[enc_dim]`` (float32) of a mono 24 kHz waveform: numpy log-mel + the ECAPA module."""

    def __init__(self, encoder):
        self._torch = torch
        self.encoder = encoder.eval()

    def embed(self, wav_24k: np.ndarray) -> np.ndarray:
        from ..audio.mel import log_mel

        torch = self._torch
        mel = torch.from_numpy(np.ascontiguousarray(log_mel(wav_24k), dtype=np.float32))[None]
        param = next(self.encoder.parameters())
        with torch.inference_mode():
            out = self.encoder(mel.to(device=param.device, dtype=param.dtype))[0]
        return out.float().cpu().numpy()


class TorchSpeechEncoder:
    """ICL reference codes ``[ceil(N/1920), 16]`` int64 of a mono 24 kHz waveform."""

    def __init__(self, encoder):
        self._torch = torch
        self.encoder = encoder.eval()

    def encode(self, wav_24k: np.ndarray) -> np.ndarray:
        torch = self._torch
        wav = torch.from_numpy(np.ascontiguousarray(wav_24k, dtype=np.float32))[None]
        with torch.inference_mode():
            codes = self.encoder.encode(wav)
        return codes[0].cpu().numpy().astype(np.int64)


# ----------------------------------------------------------------------------- openers
def open_generation(talker_spec, predictor_spec, ctx: OpenContext) -> TorchBackend:
    return TorchBackend(load_part(ctx, "talker"), threads=ctx.threads)


def open_vocoder(spec, ctx: OpenContext):
    """Plan options: ``mode`` ("step" | "full"), ``main`` (frames per step, 16), ``threads``,
    ``stack_streams`` (a batched server vectorizes several streams' steps: see TorchVocoder),
    ``precision`` ("fp32" | "bf16": the step's convolutions; default the entry's ``precision``, else fp32)."""
    decoder = load_part(ctx, "decoder")
    if spec.options.get("mode", "step") == "full":
        return TorchFullVocoder(decoder)
    return TorchVocoder(decoder, int(spec.options.get("main", 16)), spec.options.get("threads", ctx.threads),
                        bool(spec.options.get("stack_streams", False)),
                        str(spec.options.get("precision", spec.precision or "fp32")))  # fmt: skip


OPENERS = {
    "generation": open_generation,
    "vocoder": open_vocoder,
    "speaker_encoder": lambda spec, ctx: TorchSpeakerEncoder(load_part(ctx, "speaker_encoder")),
    "speech_encoder": lambda spec, ctx: TorchSpeechEncoder(load_part(ctx, "encoder")),
}
