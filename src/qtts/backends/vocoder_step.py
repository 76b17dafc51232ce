"""The host side of the stateful vocoder step, shared by every runtime that runs it.

A compiled step (:class:`~qtts.model.vocoder_step.VocoderStep`, exported by ``qtts export vocoder``)
decodes ``B`` frames per call from a flat state vector. :class:`StepContract` is what a host needs
to drive it (stored in the artifact); :class:`StepVocoder` is the part a runtime builds once
(sessions, modules: ``run(size, codes, freqs, valid, cache)``); :class:`StepStream` is the
per-utterance schedule and state over it.

Schedule: ``main`` steps while at least ``main`` frames are left, then smaller compiled steps
(``first``); a remainder shorter than every compiled size is decoded by a zero-padded step whose
samples past the remainder are dropped and whose cache is *not* kept: the remainder frames stay
pending and are decoded again, from the last committed cache, at the start of the next call
(their audio, already returned, is skipped). Causality makes the recomputed samples identical,
so the output is exact. A runner with ``exact_remainder`` (torch) gets an exact-size step instead.

:meth:`StepStream.plan` is that schedule as a generator of :class:`StepRequest` s: ``decode``
drives it with the runtime's ``run``; :class:`qtts.backends.vocoder_batch.VocoderBatcher` drives
several streams' plans at once and stacks their steps of one size into one ``run_batch`` call.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from ..config import NUM_CODEBOOKS
from ..errors import InputError
from .base import Vocoder, VocoderStream

TWO_PI = 2.0 * np.pi
STEP_INPUTS = ("audio_codes", "freqs_in", "cache_valid", "cache_in")
STEP_OUTPUTS = ("audio_values", "cache_out")


def rope_freqs(start: int, count: int, inv_freq: np.ndarray) -> np.ndarray:
    """[count, head_dim/2] fp32 RoPE angles of positions start..start+count-1, reduced mod 2*pi.

    ``inv_freq`` must be the model's fp32 inverse frequencies exactly as the offline decode uses
    them (``qtts.model.layers.rope_inv_freq``; exports store them, since numpy's pow differs from
    torch's in the last ulp). The product pos*inv_freq is rounded to fp32 exactly as the offline
    decode computes it, then reduced in float64, so cos/sin of the result equal the offline ones
    to fp32 rounding while the angle stays small enough for fp16 hardware.
    """
    pos = np.arange(start, start + count, dtype=np.float32)[:, None]
    angles = pos * np.asarray(inv_freq, dtype=np.float32)[None, :]  # fp32 product
    return np.mod(angles.astype(np.float64), TWO_PI).astype(np.float32)


@dataclass(frozen=True)
class StepContract:
    """What a host needs to drive a compiled step; stored in the artifact (ONNX metadata / sidecar)."""

    codes_length: int  # B: frames per call
    cache_size: int  # N: flat state length (independent of B)
    head_dim: int
    kv_slots: int  # sliding window - 1
    samples_per_frame: int
    inv_freq: tuple  # fp32 RoPE inverse frequencies (head_dim/2 values)
    num_quantizers: int = NUM_CODEBOOKS
    streams: int = 1  # > 1: a stacked step (that many streams per call: StepVocoder.run_batch)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, data: dict, where: str) -> StepContract:
        try:
            data = dict(data)
            data["inv_freq"] = tuple(float(x) for x in data["inv_freq"])
            return cls(**data)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: not a qtts vocoder step contract ({exc}); re-export it") from exc

    def same_model(self, other: StepContract) -> bool:
        """True when two steps share one state layout (they may differ only in B)."""
        keys = ("cache_size", "head_dim", "kv_slots", "inv_freq")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


def pair_contracts(contracts: dict, main: str) -> StepContract:
    """The ``main`` contract, after checking every other artifact comes from the same model."""
    for path, c in contracts.items():
        if not c.same_model(contracts[main]):
            raise InputError(
                f"{path}: 'first' and 'main' artifacts come from different models (cache layouts differ)"
            )
    return contracts[main]


class StepVocoder(Vocoder):
    """A runtime's compiled steps; subclasses set ``contract``, ``sizes`` and implement ``run``."""

    batches = True  # run_batch below: a VocoderBatcher can share it

    contract: StepContract
    sizes: list  # compiled step sizes, largest first
    exact_remainder = False  # True when run() accepts any size: remainders are never padded

    def run(self, size: int, codes, freqs, valid, cache) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def run_batch(self, size: int, codes, freqs, valid, cache) -> tuple[np.ndarray, np.ndarray]:
        """Several streams' steps of one size: codes [S, 1, 16, size], freqs [S, size, head_dim/2],
        valid [S, 1], cache [S, N] -> audio [S, size * samples_per_frame], cache [S, N].

        This default runs them one after another, each exactly as alone (bit-identical); a
        runtime with a stream-axis graph may override it."""
        outs = [self.run(size, codes[i], freqs[i], valid[i], cache[i]) for i in range(len(codes))]
        audio = np.stack([np.asarray(a, dtype=np.float32).reshape(-1) for a, _ in outs])
        return audio, np.stack([np.asarray(c, dtype=np.float32).reshape(-1) for _, c in outs])

    def stream(self) -> StepStream:
        return StepStream(self)

    def warm(self) -> None:
        """A silent decode of one call of every size, so that a first request pays none of the
        first-call costs: each step built (TorchVocoder's bf16 ones packed, ~2 s), every session's
        first run (the ONNX vocoder: 0.4 s). Zen 4 VM: first audio 744-761 ms cold, ~200 warm."""
        self.stream().decode(np.zeros((sum(self.sizes), self.contract.num_quantizers), dtype=np.int64))


class StepStream(VocoderStream):
    """One utterance's state and schedule over a :class:`StepVocoder` (see the module docstring)."""

    def __init__(self, steps: StepVocoder):
        self.steps = steps
        self.contract = steps.contract
        self.samples_per_frame = steps.contract.samples_per_frame
        self._inv_freq = np.asarray(steps.contract.inv_freq, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        self._cache = np.zeros(self.contract.cache_size, dtype=np.float32)
        self._pos = 0  # committed frames
        self._pending = np.zeros((0, self.contract.num_quantizers), dtype=np.int64)

    def _request(self, frames: np.ndarray, size: int) -> StepRequest:
        n = len(frames)
        codes = np.zeros((1, self.contract.num_quantizers, size), dtype=np.int64)
        codes[0, :, :n] = frames.T
        freqs = rope_freqs(self._pos, size, self._inv_freq)
        valid = np.array([min(self._pos, self.contract.kv_slots)], dtype=np.float32)
        return StepRequest(size, codes, freqs, valid, self._cache, n)

    def _size(self, left: int) -> int | None:
        fits = next((s for s in self.steps.sizes if s <= left), None)
        return fits if fits is not None or not self.steps.exact_remainder else left

    def plan(self, codes: np.ndarray):
        """:meth:`decode` as a generator: it yields each :class:`StepRequest` in order, is sent the
        step's raw ``(audio, cache)`` back, and returns the call's audio (StopIteration.value).

        Whoever runs the steps (this stream alone, or a batcher stacking several streams' steps)
        drives the same schedule and state updates, so the audio is the same."""
        frames = np.concatenate([self._pending, np.asarray(codes, dtype=np.int64)])
        skip = len(self._pending) * self.samples_per_frame
        self._pending = frames[:0]
        outs, i = [], 0
        while i < len(frames):
            size = self._size(len(frames) - i)
            padded = size is None  # shorter than every compiled size: pad, keep the cache uncommitted
            request = self._request(frames[i:] if padded else frames[i : i + size], size or self.steps.sizes[-1])
            audio, cache = yield request
            outs.append(np.asarray(audio, dtype=np.float32).reshape(-1)[: request.frames * self.samples_per_frame])
            if padded:
                self._pending = frames[i:]
                break
            self._cache = np.asarray(cache, dtype=np.float32).reshape(-1)
            self._pos += size
            i += size
        out = np.concatenate(outs) if outs else np.zeros(0, dtype=np.float32)
        return out[skip:]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return drive(self.plan(codes), self.steps.run)

    def close(self) -> None:
        """Nothing to give back: the state is this object's own."""


@dataclass(frozen=True)
class StepRequest:
    """One step call a stream's :meth:`StepStream.plan` asks for (``frames`` of ``size`` are real)."""

    size: int
    codes: np.ndarray  # [1, 16, size] int64
    freqs: np.ndarray  # [size, head_dim/2] fp32
    valid: np.ndarray  # [1] fp32
    cache: np.ndarray  # [N] fp32
    frames: int

    @property
    def args(self) -> tuple:
        return self.size, self.codes, self.freqs, self.valid, self.cache


def drive(plan, run) -> np.ndarray:
    """Run a :meth:`StepStream.plan` generator to its end with ``run(size, codes, freqs, valid, cache)``."""
    try:
        request = next(plan)
        while True:
            request = plan.send(run(*request.args))
    except StopIteration as stop:
        return stop.value
