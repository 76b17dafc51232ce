"""The pieces a :class:`qtts.TTS` runs on: config, tokenizer, backend, decoders, encoders.

:meth:`Runtime.open` reads a snapshot and an optional execution plan and wires the parts;
tests build a Runtime directly from fakes. The torch checkpoint is loaded lazily, only when a
torch component needs it (a plan that names other runtimes for everything never imports torch).
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .config import ModelConfig
from .errors import InputError

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, config: ModelConfig, tokenizer, backend, *, checkpoint_loader=None,
                 decoder_factory=None, plan=None, snapshot_dir: str | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.backend = backend
        self.plan = plan
        self.snapshot_dir = snapshot_dir
        self._checkpoint_loader = checkpoint_loader
        self._checkpoint = None
        self._decoder_factory = decoder_factory
        self.threads: int | None = None  # intra-op threads for every component (None: each default)

    @classmethod
    def open(cls, model: str, plan=None, dtype: str = "float32", threads: int | None = None,
             backend=None) -> Runtime:
        from .backends import create_backend
        from .frontend import TextTokenizer

        snapshot = _snapshot_dir(model)
        config = ModelConfig.from_dir(snapshot)
        plan = read_plan(plan)
        tokenizer = TextTokenizer.from_dir(snapshot)

        def loader():
            from .backends.torch import torch_dtype
            from .weights import load_checkpoint

            # the speech tokenizer stays fp32 whatever the talker dtype: bf16 vocoders are where
            # peers found NaN/noise, and it is a small share of the time
            return load_checkpoint(snapshot, dtype=torch_dtype(dtype), speech_tokenizer_dtype=torch_dtype("float32"))

        rt = cls(config, tokenizer, None, checkpoint_loader=loader, plan=plan, snapshot_dir=snapshot)
        rt.threads = threads
        if backend is None:
            ckpt = rt.checkpoint if _impl(plan, "talker") == "torch" else None
            backend = create_backend(snapshot, plan, checkpoint=ckpt, dtype=dtype, threads=threads)
        rt.backend = backend
        return rt

    @property
    def checkpoint(self):
        if self._checkpoint is None:
            if self._checkpoint_loader is None:
                raise InputError("this runtime has no torch checkpoint (needed for this component)")
            self._checkpoint = self._checkpoint_loader()
        return self._checkpoint

    # -- speech decoder --------------------------------------------------------------------------
    def new_decoder(self):
        """A fresh stateful streaming decoder: ``decode(codes [n,16]) -> float32 [n*1920]``."""
        if self._decoder_factory is not None:
            return self._decoder_factory()
        return make_decoder(self)

    # -- prompts -----------------------------------------------------------------------------------
    def build_prompt(self, text: str, mode, voice, options):
        """(Prompt, number of target text tokens) for one text piece."""
        from .prompt import build_prompt

        prompt = build_prompt(
            self.config, self.tokenizer, text, mode=mode.kind, language=mode.language,
            speaker=mode.speaker, instruct=mode.instruct, has_speaker_vector=mode.xvector,
            ref_text=voice.ref_text if mode.icl else None,
            ref_codes=voice.ref_codes if mode.icl else None,
            non_streaming_text=options.non_streaming_text,  # None = official wrapper default
        )
        return prompt, int(prompt.text_token_count)

    # -- encoders (voice creation) -------------------------------------------------------------
    def speaker_embedding(self, wav_24k: np.ndarray) -> np.ndarray:
        spec = self.plan.get("speaker_encoder") if self.plan is not None else None
        if spec is not None and spec.impl == "onnx":  # torch-free x-vector from an exported encoder
            from .backends.onnx import OnnxSpeakerEncoder

            return OnnxSpeakerEncoder(spec.artifact("main")).embed(wav_24k)
        import torch

        from .mel import log_mel

        enc = self.checkpoint.model.speaker_encoder
        if enc is None:
            raise InputError("this checkpoint has no speaker encoder (only Base checkpoints clone voices)")
        mel = torch.from_numpy(np.ascontiguousarray(log_mel(wav_24k), dtype=np.float32))[None]
        param = next(enc.parameters())
        with torch.inference_mode():
            out = enc(mel.to(param.dtype))[0]
        return out.float().numpy()

    def encode_codes(self, wav_24k: np.ndarray) -> np.ndarray:
        spec = self.plan.get("speech_encoder") if self.plan is not None else None
        if spec is not None and spec.impl == "onnx":  # torch-free ICL reference codes
            from .backends.onnx import OnnxSpeechEncoder

            return OnnxSpeechEncoder(spec.artifact("main")).encode(wav_24k)
        import torch

        enc = self.checkpoint.speech_tokenizer.encoder
        with torch.inference_mode():
            codes = enc.encode(torch.from_numpy(np.ascontiguousarray(wav_24k, dtype=np.float32))[None])
        return codes[0].cpu().numpy().astype(np.int64)


def _snapshot_dir(model) -> str:
    """A local snapshot directory as is (no torch import); hub ids through qtts.weights."""
    if os.path.isdir(model):
        return os.path.abspath(model)
    from .weights import resolve_snapshot

    return resolve_snapshot(model)


def read_plan(plan):
    """None, a dict, a path or a Plan -> a validated :class:`qtts.plan.Plan`."""
    from .plan import load_plan

    return load_plan(plan)


def _impl(plan, component: str) -> str:
    from .backends import _impl as impl_of
    from .backends import _plan_entry

    entry = _plan_entry(plan, component)
    return "torch" if entry is None else impl_of(entry)


def make_decoder(rt: Runtime):
    """The stateful streaming decoder the plan names (``speech_decoder``; torch step by default)."""
    from .decoders import create_decoder

    return create_decoder(rt.snapshot_dir, plan=rt.plan, checkpoint_loader=lambda: rt.checkpoint,
                          threads=rt.threads)
