"""The vocoder's bf16 bar (docs/fidelity.md): is a plan's streaming vocoder as close to fp32 as bf16 is?

The model's authors measured every published quality number with ``dtype=torch.bfloat16``. A
vocoder whose distance to the fp32 decode is no larger than bf16's is faithful by their standard.
:func:`vocoder_fidelity` decodes ``frames`` random-code frames (seed 0; random weights decode
noise, not speech, so the codes' origin does not matter) three ways:

* the fp32 reference: the torch offline decode;
* the bar: the same decoder cast to bf16 (weights and activations, as the authors ran it), offline;
* the plan: its streaming vocoder, one frame first, then chunks of ``chunk`` frames;

and reports :func:`qtts.export.audio_metrics.audio_distances` of the bar and of the plan against
the reference, and whether the plan meets the bar on all three (:func:`meets_bar`).
"""

from __future__ import annotations

import logging

import numpy as np

from .audio_metrics import audio_distances

log = logging.getLogger(__name__)

#: metric -> True when larger is better
METRICS = {"snr_db": True, "worst_segment_snr_db": True, "lsd_db": False}


def random_codes(frames: int, num_quantizers: int, codebook_size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, codebook_size, (frames, num_quantizers))


def stream_decode(stream, codes: np.ndarray, first: int = 1, chunk: int = 8) -> np.ndarray:
    """``codes`` [T, 16] through a vocoder stream: ``first`` frames, then chunks of ``chunk``."""
    pieces, i = [], 0
    while i < len(codes):
        n = first if i == 0 else chunk
        pieces.append(np.asarray(stream.decode(codes[i : i + n]), dtype=np.float32).reshape(-1))
        i += n
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def offline_decode(decoder, codes: np.ndarray, dtype=None) -> np.ndarray:
    """The torch offline decode of ``codes`` [T, 16] (``dtype``: cast a copy of the decoder first)."""
    import copy

    import torch

    if dtype is not None:
        decoder = copy.deepcopy(decoder).to(dtype)
    with torch.inference_mode():
        out = decoder(torch.from_numpy(np.ascontiguousarray(codes.T[None])))
    return out.reshape(-1).float().numpy()


def meets_bar(test: dict, bar: dict) -> bool:
    """True when ``test`` is at least as close to fp32 as ``bar`` on every metric of :data:`METRICS`."""
    return all((test[k] >= bar[k]) if higher else (test[k] <= bar[k]) for k, higher in METRICS.items())


def vocoder_fidelity(vocoder, decoder, frames: int = 320, chunk: int = 8) -> dict:
    """The plan's streaming ``vocoder`` and the bf16 bar against the fp32 offline decode of ``frames``
    random-code frames (see the module docstring)."""
    import torch

    cfg = decoder.config
    codes = random_codes(frames, cfg.num_quantizers, cfg.codebook_size)
    ref = offline_decode(decoder, codes)
    bar = audio_distances(ref, offline_decode(decoder, codes, torch.bfloat16))
    plan = audio_distances(ref, stream_decode(vocoder.stream(), codes, chunk=chunk))
    log.info("vocoder over %d frames: plan %s, bf16 bar %s", frames, plan, bar)
    return {"frames": int(frames), "plan": plan, "bf16_bar": bar, "meets_bar": meets_bar(plan, bar)}
