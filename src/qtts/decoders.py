"""Streaming speech decoders (placeholder; filled in below)."""

from __future__ import annotations

import numpy as np

TWO_PI = 2.0 * np.pi


def rope_freqs(start: int, count: int, inv_freq: np.ndarray) -> np.ndarray:
    """[count, head_dim/2] fp32 RoPE angles of positions start..start+count-1, reduced mod 2*pi.

    ``inv_freq`` must be the model's fp32 inverse frequencies exactly as the offline decode uses
    them (``qtts.model.vocoder.rope_inv_freq``; exports store them, since numpy's pow differs from
    torch's in the last ulp). The product pos*inv_freq is rounded to fp32 exactly as the offline
    decode computes it, then reduced in float64, so cos/sin of the result equal the offline ones
    to fp32 rounding while the angle stays small enough for fp16 hardware.
    """
    pos = np.arange(start, start + count, dtype=np.float32)[:, None]
    angles = pos * np.asarray(inv_freq, dtype=np.float32)[None, :]  # fp32 product
    return np.mod(angles.astype(np.float64), TWO_PI).astype(np.float32)
