"""The torch backend: the seam of :mod:`qtts.backends.base` over ``qtts.model`` modules.

Static KV buffers (one talker cache per generation, one reused 17-slot predictor cache per
thread, so concurrent generations on one backend do not interfere),
fp32 or bf16 weights, ``torch.inference_mode``. Embeddings cross the seam as float32 numpy;
inputs are cast to the model dtype inside.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from ..errors import require
from .base import sample_residuals

log = logging.getLogger(__name__)

_DTYPES = ("float32", "bfloat16")


def torch_dtype(name: str):
    torch = require("torch", "torch", "the torch backend")
    if name not in _DTYPES:
        from ..errors import InputError

        raise InputError(f"dtype '{name}' is not supported; valid: {', '.join(_DTYPES)}")
    return getattr(torch, name)


class TorchBackend:
    """Talker + code predictor in torch; implements :class:`~qtts.backends.base.Backend`."""

    #: concurrent generations are safe: modules are stateless, KV state is per call, the
    #: predictor cache is per thread
    thread_safe = True

    def __init__(self, talker, threads: int | None = None):
        torch = require("torch", "torch", "the torch backend")
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

    def predict_frame(self, hidden: np.ndarray, code0: int, params, uniforms: np.ndarray) -> np.ndarray:
        torch = self._torch
        h = torch.as_tensor(np.asarray(hidden, dtype=np.float32), device=self.device).to(self.dtype)
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self.predictor.new_cache(17)

        def step_logits(j: int, code: int) -> np.ndarray:
            nonlocal cache
            ids = self._ids([[code]])
            if j == 0:
                x = torch.cat([h.view(1, 1, -1), self.talker_module.embed_codec(ids)], dim=1)
                pos = 0
            else:
                x, pos = self.predictor.embed(j - 1, ids), j + 1
            out, cache = self.predictor(x, pos, cache)
            return self._out(self.predictor.head(j, out[0, -1]))

        with torch.inference_mode():
            codes = sample_residuals(step_logits, code0, params, uniforms)
        self._local.cache = cache
        return codes


def create(snapshot_dir: str, components: dict, checkpoint=None, dtype: str = "float32", threads=None):
    """Factory used by :func:`qtts.backends.create_backend` for ``impl: torch``."""
    if checkpoint is None:
        from ..weights import load_checkpoint

        checkpoint = load_checkpoint(snapshot_dir, dtype=torch_dtype(dtype), components=("talker",))
    return TorchBackend(checkpoint.model.talker, threads=threads)
