"""Helpers shared by the vocoder test modules (test_vocoder_*.py, test_rknn.py)."""

from __future__ import annotations

import numpy as np
import torch


def load_decoder(snapshot: str):
    from qtts.weights import load_checkpoint

    return load_checkpoint(snapshot, components=("decoder",)).speech_tokenizer.decoder.eval()


def random_codes(frames: int, seed: int = 0, nq: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (frames, nq)).astype(np.int64)


def full_decode(decoder, codes: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return decoder(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()


def feed(decoder, codes: np.ndarray, chunks: list[int]) -> np.ndarray:
    """Stream ``codes`` through a StreamingDecoder in chunks (the last size repeats)."""
    outs, i, k = [], 0, 0
    while i < len(codes):
        n = chunks[min(k, len(chunks) - 1)]
        out = decoder.decode(codes[i : i + n])
        assert len(out) == len(codes[i : i + n]) * decoder.samples_per_frame
        outs.append(out)
        i, k = i + n, k + 1
    return np.concatenate(outs)


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Non-degenerate random decoder weights (codebooks non-zero, norms at 1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("cluster_usage"):
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        elif name.endswith("embedding_sum"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith((".alpha", ".beta")):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        elif "norm" in name or name.endswith((".scale", "gamma")):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name else p + 0.01)
        else:
            p.copy_(0.05 * torch.randn(p.shape, generator=g))
