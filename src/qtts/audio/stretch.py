"""Pitch-preserving time stretch (speaking rate) that streams: WSOLA in numpy.

Why our own: the maintained stretchers on PyPI either do not stream (``pedalboard.time_stretch``,
``libtsm``, ``pytsmod``, ``audiostretchy``: whole buffers only), shell out to a CLI
(``pyrubberband``), are GPL (Rubber Band: ``pedalboard``, ``pylibrb``) or unmaintained since 2017
(``audiotsm``). WSOLA (waveform-similarity overlap-add, Verhelst & Roelands 1993) suits speech:
it copies short windows of the input and picks each one's position, within a small tolerance,
where it continues the previous window best, so the pitch stays and the joins are in phase.

:class:`TimeStretcher` is causal and exact: ``push(x)`` returns every output sample whose value
is final, ``flush()`` the rest, so any split of the input into chunks gives the **same samples**
as one call (the streamed output equals the offline output; tests check it bit for bit), and
chunk joins cannot add seams. ``speed`` 2.0 halves the duration; the output of ``n`` input samples
has ``round(n / speed)`` samples. ``speed == 1`` passes the input through untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np

from ..errors import InputError
from ..options import MAX_SPEED, MIN_SPEED

#: window length in seconds: 40 ms holds two pitch periods of a low voice
FRAME_S = 0.040
#: search tolerance in seconds: at least one pitch period (70 Hz) so a window can land in phase
TOLERANCE_S = 0.015


def check_speed(speed) -> float:
    """``speed`` as a float in [0.25, 4.0]; InputError naming the range otherwise."""
    try:
        value = float(speed)
    except (TypeError, ValueError):
        value = math.nan
    if not MIN_SPEED <= value <= MAX_SPEED:
        raise InputError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}] (1.0 = unchanged), got {speed!r}")
    return value


class TimeStretcher:
    """Streaming WSOLA for one mono signal. Not thread-safe; one per utterance."""

    def __init__(self, speed: float, sample_rate: int = 24000):
        self.speed = check_speed(speed)
        half = max(16, int(round(FRAME_S * sample_rate / 2)))
        self.hop = half  # synthesis hop: windows overlap by half
        self.size = 2 * half  # window length
        self.tol = max(1, int(round(TOLERANCE_S * sample_rate)))
        n = np.arange(self.size)
        self.window = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / self.size)  # periodic Hann: halves sum to 1
        # the input, padded in front with hop + tol zeros; _buf holds it from index _base on
        self._buf = np.zeros(self.hop + self.tol)
        self._base = 0
        self._received = 0  # real input samples pushed
        self._k = 0  # next window index
        self._prev = -1  # padded input position of the previous window
        self._acc = np.zeros(self.size)  # output of the windows so far, from output index _out_base
        self._out_base = 0
        self._emitted = 0  # real output samples returned
        self._done = False

    # -- public -----------------------------------------------------------------------------
    def push(self, samples: np.ndarray) -> np.ndarray:
        """Add input; returns the output samples that are final now (float32)."""
        x = np.asarray(samples, dtype=np.float64).reshape(-1)
        if self._done:
            raise ValueError("push() after flush(): use a new TimeStretcher per utterance")
        if self.speed == 1.0:
            self._received += len(x)
            return x.astype(np.float32)
        self._buf = np.concatenate([self._buf, x])
        self._received += len(x)
        self._run(limit=self._base + len(self._buf))
        return self._take()

    def flush(self) -> np.ndarray:
        """The rest of the output (the input ends here): ``round(n / speed)`` samples in all."""
        if self._done:
            return np.zeros(0, dtype=np.float32)
        self._done = True
        if self.speed == 1.0:
            return np.zeros(0, dtype=np.float32)
        target = int(math.floor(self._received / self.speed + 0.5))
        while self._final_end() - self.hop < target:
            need = self._needed(self._k) - (self._base + len(self._buf))
            if need > 0:
                self._buf = np.concatenate([self._buf, np.zeros(need)])
            self._step()
        return self._take(limit=target)

    @property
    def output_samples(self) -> int:
        """Output samples returned so far."""
        return self._received if self.speed == 1.0 else self._emitted

    # -- internals --------------------------------------------------------------------------
    def _anchor(self, k: int) -> int:
        """Nominal padded input position of window ``k`` (its centre maps to output k * hop)."""
        return self.tol + int(math.floor(k * self.hop * self.speed + 0.5))

    def _needed(self, k: int) -> int:
        """Padded input length window ``k`` needs (its whole search range)."""
        return self._anchor(k) + self.tol + self.size

    def _final_end(self) -> int:
        """Output samples (padded, from 0) whose value no later window changes."""
        return self._k * self.hop

    def _run(self, limit: int) -> None:
        while self._needed(self._k) <= limit:
            self._step()

    def _slice(self, start: int, length: int) -> np.ndarray:
        i = start - self._base
        return self._buf[i : i + length].copy()

    def _position(self, k: int) -> int:
        """Where window ``k`` is taken: the nominal position moved by up to ``tol`` samples to the
        place most similar to the natural continuation of window ``k - 1`` (its overlap part)."""
        anchor = self._anchor(k)
        if k == 0:
            return anchor
        overlap = self.size - self.hop
        template = self._slice(self._prev + self.hop, overlap)
        region = self._slice(anchor - self.tol, overlap + 2 * self.tol)
        score = np.correlate(region, template, mode="valid")
        best = int(np.argmax(score))
        if score[best] <= 0.0:  # silence or no similar place: keep the nominal position
            return anchor
        return anchor - self.tol + best

    def _step(self) -> None:
        k = self._k
        pos = self._position(k)
        start = k * self.hop - self._out_base
        self._acc[start : start + self.size] += self.window * self._slice(pos, self.size)
        self._prev = pos
        self._k += 1
        keep = min(self._anchor(self._k) - self.tol, self._prev + self.hop)  # the next window's reach
        if keep - self._base > 4 * self.size:
            self._buf = self._buf[keep - self._base :]
            self._base = keep
        if self._k * self.hop - self._out_base + self.size > len(self._acc):
            self._acc = np.concatenate([self._acc, np.zeros(len(self._acc))])

    def _take(self, limit: int | None = None) -> np.ndarray:
        """Final output samples not returned yet (real output: the first ``hop`` padded samples
        are window 0's fade-in over the padding and are dropped)."""
        end = self._final_end() - self.hop
        if limit is not None:
            end = min(end, limit)
        start = self._emitted
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        lo = start + self.hop - self._out_base
        out = self._acc[lo : lo + end - start].astype(np.float32)
        self._emitted = end
        drop = self._emitted + self.hop - self._out_base
        if drop > 2 * self.size:
            self._acc = self._acc[drop:].copy()
            self._out_base += drop
        return out


def stretch(samples: np.ndarray, speed: float, sample_rate: int = 24000) -> np.ndarray:
    """Offline: the whole signal at once (same samples as streaming it through a TimeStretcher)."""
    st = TimeStretcher(speed, sample_rate)
    return np.concatenate([st.push(samples), st.flush()])


def stretch_chunks(chunks: Iterator, speed: float) -> Iterator:
    """Stretch a stream of :class:`qtts.audio.AudioChunk` as it comes; closing it closes ``chunks``.

    Chunks keep their frame fields; the final one carries the flushed tail, and its ``info`` gets
    the stretched ``audio_s`` (and ``rtf`` over it) plus ``speed``.
    """
    stretcher = None
    try:
        for chunk in chunks:
            if stretcher is None:
                stretcher = TimeStretcher(speed, chunk.sample_rate)
            samples = stretcher.push(chunk.samples)
            info = chunk.info
            if chunk.is_final:
                samples = np.concatenate([samples, stretcher.flush()])
                info = _final_info(info, stretcher, chunk.sample_rate)
            yield dataclasses.replace(chunk, samples=samples, info=info)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _final_info(info: dict, stretcher: TimeStretcher, sample_rate: int) -> dict:
    info = dict(info)
    audio_s = stretcher.output_samples / sample_rate
    info["speed"] = stretcher.speed
    if "audio_s" in info:
        info["audio_s"] = audio_s
        wall = info.get("wall_s")
        info["rtf"] = (wall / audio_s) if (wall is not None and audio_s) else None
    return info
