"""Streaming speech decoders: codes in, audio out, state carried across calls (no seams).

Protocol (:class:`StreamingDecoder`): ``samples_per_frame``, ``reset()``, and
``decode(codes: np.ndarray [n, 16] int64) -> np.ndarray float32 [n * 1920]``. Every frame is
final when decoded, so there is no ``flush()``: concatenating the outputs of any sequence of
calls equals the offline decode of all the codes.

Implementations:

* :class:`TorchStepDecoder` - :class:`~qtts.model.vocoder_step.VocoderStep` in torch; steps of
  ``main`` frames, and exact-size steps (built lazily) for shorter remainders.
* :class:`TorchFullDecoder` - the offline decoder, re-run over the whole prefix (reference).
* :class:`OnnxStepDecoder` / :class:`RknnStepDecoder` - compiled fixed-size steps (``main`` and an
  optional smaller ``first`` artifact). They share :class:`FixedStepDecoder`'s schedule: ``main``
  steps while at least ``main`` frames are left, then ``first`` steps, and a remainder shorter
  than every compiled size is decoded by a zero-padded step whose samples past the remainder
  are dropped and whose cache is *not* kept: the remainder frames stay pending and are decoded
  again, from the last committed cache, at the start of the next call (their audio, already
  returned, is skipped). Causality makes the recomputed samples identical, so the output is
  exact; the price is recomputing fewer than ``first`` (or ``main``) frames per odd-sized call.
  Calls whose sizes are multiples of ``first`` never pad.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from .errors import InputError, QttsError, require

log = logging.getLogger(__name__)

TWO_PI = 2.0 * np.pi
STEP_INPUTS = ("audio_codes", "freqs_in", "cache_valid", "cache_in")
STEP_OUTPUTS = ("audio_values", "cache_out")


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


class StreamingDecoder(Protocol):
    samples_per_frame: int

    def reset(self) -> None: ...

    def decode(self, codes: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class StepContract:
    """What a host needs to drive a compiled step; stored in the artifact (ONNX metadata / sidecar)."""

    codes_length: int  # B: frames per call
    cache_size: int  # N: flat state length (independent of B)
    head_dim: int
    kv_slots: int  # sliding window - 1
    samples_per_frame: int
    inv_freq: tuple  # fp32 RoPE inverse frequencies (head_dim/2 values)
    num_quantizers: int = 16

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


def _as_codes(codes: np.ndarray, nq: int) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != nq:
        raise InputError(f"codes must be [n, {nq}], got shape {codes.shape}")
    if codes.size and codes.min() < 0:
        raise InputError("codes must be >= 0 (padding frames must be removed before decoding)")
    return codes.astype(np.int64, copy=False)


class FixedStepDecoder:
    """Schedules fixed-size steps; subclasses implement ``_run`` for one compiled size."""

    exact_remainder = False  # True when _run accepts any size (torch): remainders are never padded

    def __init__(self, contract: StepContract, sizes: list[int]):
        self.contract = contract
        self.samples_per_frame = contract.samples_per_frame
        self.sizes = sorted(set(sizes), reverse=True)  # largest first
        self._inv_freq = np.asarray(contract.inv_freq, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        self._cache = np.zeros(self.contract.cache_size, dtype=np.float32)
        self._pos = 0  # committed frames
        self._pending = np.zeros((0, self.contract.num_quantizers), dtype=np.int64)

    def _run(self, size: int, codes: np.ndarray, freqs: np.ndarray, valid: np.ndarray, cache: np.ndarray):
        raise NotImplementedError

    def _step(self, frames: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(frames)
        codes = np.zeros((1, self.contract.num_quantizers, size), dtype=np.int64)
        codes[0, :, :n] = frames.T
        freqs = rope_freqs(self._pos, size, self._inv_freq)
        valid = np.array([min(self._pos, self.contract.kv_slots)], dtype=np.float32)
        audio, cache = self._run(size, codes, freqs, valid, self._cache)
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)[: n * self.samples_per_frame]
        return audio, np.asarray(cache, dtype=np.float32).reshape(-1)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        codes = _as_codes(codes, self.contract.num_quantizers)
        frames = np.concatenate([self._pending, codes])
        skip = len(self._pending) * self.samples_per_frame
        self._pending = frames[:0]
        outs, i = [], 0
        while i < len(frames):
            left = len(frames) - i
            size = next((s for s in self.sizes if s <= left), left if self.exact_remainder else None)
            if size is None:  # shorter than every compiled size: pad, keep the cache uncommitted
                audio, _ = self._step(frames[i:], self.sizes[-1])
                outs.append(audio)
                self._pending = frames[i:]
                break
            audio, self._cache = self._step(frames[i : i + size], size)
            outs.append(audio)
            self._pos += size
            i += size
        out = np.concatenate(outs) if outs else np.zeros(0, dtype=np.float32)
        return out[skip:]


# ----------------------------------------------------------------------------- torch
class TorchStepDecoder(FixedStepDecoder):
    """VocoderStep in torch: ``main``-frame steps, then one exact-size step for the remainder
    (steps are built lazily per size and share the decoder weights, so nothing is padded)."""

    exact_remainder = True

    def __init__(self, decoder, main: int = 16, threads: int | None = None):
        from .model.vocoder_step import VocoderStep

        self._torch = require("torch", "torch", "the torch vocoder")
        dtype = next(decoder.parameters()).dtype
        if dtype != self._torch.float32:
            raise InputError(
                f"the streaming vocoder step runs in float32 (its state is an fp32 tensor), but the "
                f"decoder weights are {dtype}; load the speech tokenizer in float32 "
                "(load_checkpoint(..., speech_tokenizer_dtype=torch.float32))"
            )
        self.decoder = decoder.eval()
        self._make = VocoderStep
        self._steps: dict[int, Any] = {}
        self.threads = threads
        probe = self._get(main)
        contract = StepContract(
            main, probe.cache_size, decoder.config.head_dim, probe.layout.kv_slots,
            probe.samples_per_frame, tuple(float(x) for x in probe.inv_freq()),
            decoder.config.num_quantizers,
        )  # fmt: skip
        super().__init__(contract, [main])

    def _get(self, size: int):
        if size not in self._steps:  # later sizes share the first step's folded constants
            like = next(iter(self._steps.values()), None)
            self._steps[size] = self._make(self.decoder, size, like=like).eval()
        return self._steps[size]

    def _run(self, size, codes, freqs, valid, cache):
        torch = self._torch
        prev = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                args = (torch.from_numpy(codes), torch.from_numpy(freqs), torch.from_numpy(valid))
                audio, cache = self._get(size)(*args, torch.from_numpy(cache))
        finally:
            torch.set_num_threads(prev)
        return audio.float().numpy(), cache.float().numpy()


class TorchFullDecoder:
    """Offline decode of the whole prefix on every call (exact reference; O(n^2) over a stream)."""

    def __init__(self, decoder):
        self._torch = require("torch", "torch", "the torch vocoder")
        self.decoder = decoder.eval()
        self.samples_per_frame = decoder.samples_per_frame
        self.reset()

    def reset(self) -> None:
        self._codes = np.zeros((0, self.decoder.config.num_quantizers), dtype=np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        codes = _as_codes(codes, self.decoder.config.num_quantizers)
        done = len(self._codes) * self.samples_per_frame
        self._codes = np.concatenate([self._codes, codes])
        if not len(codes):
            return np.zeros(0, dtype=np.float32)
        with self._torch.inference_mode():
            wav = self.decoder(self._torch.from_numpy(self._codes.T[None].copy()))
        return wav.reshape(-1).float().numpy()[done:]


# ----------------------------------------------------------------------------- onnx
def read_onnx_contract(path: str) -> StepContract:
    """Read the step contract (B, N, head_dim, ...) back from an exported ONNX file."""
    onnx = require("onnx", "export", "reading an ONNX vocoder step")
    if not os.path.isfile(path):
        raise InputError(f"{path}: file not found")
    model = onnx.load(path, load_external_data=False)
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    missing = [n for n in STEP_INPUTS if n not in dims]
    if missing:
        raise InputError(
            f"{path}: not a qtts vocoder step (missing inputs {missing}); export one with `qtts export vocoder`"
        )
    meta = {p.key: p.value for p in model.metadata_props}
    if "qtts.step_contract" not in meta:
        raise InputError(f"{path}: no qtts.step_contract metadata; re-export it with `qtts export vocoder`")
    contract = StepContract.from_dict(json.loads(meta["qtts.step_contract"]), path)
    shape_ok = (
        dims["audio_codes"] == [1, contract.num_quantizers, contract.codes_length]
        and dims["freqs_in"] == [contract.codes_length, contract.head_dim // 2]
        and dims["cache_in"] == [contract.cache_size]
    )
    if not shape_ok:
        raise InputError(f"{path}: graph input shapes {dims} disagree with its metadata {contract}")
    return contract


def _check_pair(main: StepContract, first: StepContract, where: str) -> None:
    same = (main.cache_size, main.head_dim, main.kv_slots, main.inv_freq) == (
        first.cache_size, first.head_dim, first.kv_slots, first.inv_freq,
    )  # fmt: skip
    if not same:
        raise InputError(
            f"{where}: 'first' and 'main' artifacts come from different models (cache layouts differ)"
        )


class OnnxStepDecoder(FixedStepDecoder):
    """onnxruntime sessions for the ``main`` and optional ``first`` step artifacts."""

    def __init__(self, main: str, first: str | None = None, threads: int | None = None, session_factory=None):
        ort = require("onnxruntime", "onnx", "the ONNX vocoder")
        contracts = {main: read_onnx_contract(main)}
        if first:
            contracts[first] = read_onnx_contract(first)
            _check_pair(contracts[main], contracts[first], first)

        def make(path):
            if session_factory is not None:
                return session_factory(path)
            from .backends.onnx import session_options  # the engine's settings (spinning off)

            return ort.InferenceSession(path, sess_options=session_options(threads),
                                        providers=["CPUExecutionProvider"])

        self._sessions = {c.codes_length: make(p) for p, c in contracts.items()}
        super().__init__(contracts[main], list(self._sessions))

    def _run(self, size, codes, freqs, valid, cache):
        feeds = dict(zip(STEP_INPUTS, (codes, freqs, valid, cache)))
        audio, cache = self._sessions[size].run(list(STEP_OUTPUTS), feeds)
        return audio, cache


# ----------------------------------------------------------------------------- rknn
def read_rknn_contract(path: str) -> StepContract:
    """The contract of a .rknn step, from the ``<file>.json`` sidecar `qtts export rknn` writes."""
    side = path + ".json"
    if not os.path.isfile(side):
        raise InputError(f"{side}: missing; it is written by `qtts export rknn` next to the .rknn file")
    with open(side, encoding="utf-8") as fh:
        return StepContract.from_dict(json.load(fh), side)


class RknnStepDecoder(FixedStepDecoder):
    """rknn-toolkit-lite2 runtime (on the board) for the ``main`` / ``first`` .rknn steps.

    ``runtime_factory()`` returns an object with the ``RKNNLite`` API (``load_rknn``,
    ``init_runtime``, ``inference(inputs=[...])``, ``release``); the default imports rknnlite.
    """

    def __init__(
        self, main: str, first: str | None = None, core_mask: int | None = None, runtime_factory=None
    ):
        if runtime_factory is None:
            api = require("rknnlite.api", "rknn", "the RKNN vocoder (on a Rockchip board)")
            runtime_factory = api.RKNNLite
        paths = [main] + ([first] if first else [])
        contracts = {p: read_rknn_contract(p) for p in paths}
        if first:
            _check_pair(contracts[main], contracts[first], first)
        self._runtimes = {}
        for p in paths:
            rt = runtime_factory()
            if rt.load_rknn(p) != 0:
                raise QttsError(f"{p}: rknnlite load_rknn failed")
            ret = rt.init_runtime() if core_mask is None else rt.init_runtime(core_mask=core_mask)
            if ret != 0:
                raise QttsError(
                    f"{p}: rknnlite init_runtime failed ({ret}); is librknnrt.so installed on the board?"
                )
            self._runtimes[contracts[p].codes_length] = rt
        super().__init__(contracts[main], list(self._runtimes))

    def _run(self, size, codes, freqs, valid, cache):
        outs = self._runtimes[size].inference(inputs=[codes, freqs, valid, cache])
        if outs is None or len(outs) != 2:
            raise QttsError("rknnlite inference returned no outputs")
        return outs[0], outs[1]

    def close(self) -> None:
        for rt in self._runtimes.values():
            rt.release()
        self._runtimes = {}


# ----------------------------------------------------------------------------- factory
def _torch_decoder(checkpoint_or_dir):
    """Accept a Decoder, a Checkpoint / SpeechTokenizer (``.decoder``), or a snapshot dir."""
    if isinstance(checkpoint_or_dir, (str, os.PathLike)):
        from .weights import load_checkpoint

        checkpoint_or_dir = load_checkpoint(str(checkpoint_or_dir), components=("decoder",))
    for attr in ("speech_tokenizer", "decoder"):
        if hasattr(checkpoint_or_dir, attr) and not hasattr(checkpoint_or_dir, "quantizer"):
            checkpoint_or_dir = getattr(checkpoint_or_dir, attr)
    return checkpoint_or_dir


def make_decoder(spec, checkpoint_or_dir=None, threads: int | None = None) -> StreamingDecoder:
    """Build the speech decoder a plan entry (``qtts.plan.ComponentSpec`` or None) asks for.

    torch options: ``mode`` ("step" default | "full"), ``main`` (16), ``threads``. (torch needs no
    ``first``: a call shorter than ``main`` simply gets a step of its own size.)
    onnx options: ``threads``. rknn options: ``core_mask``. ``threads`` (the runtime's setting)
    applies where the plan entry sets none.
    """
    impl = getattr(spec, "impl", "torch") if spec is not None else "torch"
    opts = dict(getattr(spec, "options", None) or {})
    arts = dict(getattr(spec, "artifacts", None) or {})
    threads = opts.get("threads", threads)
    if impl == "torch":
        dec = _torch_decoder(checkpoint_or_dir)
        if opts.get("mode", "step") == "full":
            return TorchFullDecoder(dec)
        return TorchStepDecoder(dec, int(opts.get("main", 16)), threads)
    if impl == "onnx":
        return OnnxStepDecoder(arts["main"], arts.get("first"), threads)
    if impl == "rknn":
        return RknnStepDecoder(arts["main"], arts.get("first"), opts.get("core_mask"))
    if impl == "qnn":  # qnn options: soc_model, fp16 (qtts.qnn.QnnOptions)
        from .decoders_qnn import QnnStepDecoder

        return QnnStepDecoder(arts["main"], arts.get("first"), opts)
    raise InputError(f"speech_decoder impl '{impl}' is not supported; use torch, onnx, rknn or qnn")


def create_decoder(snapshot_dir: str | None, plan=None, checkpoint_loader=None,
                   threads: int | None = None) -> StreamingDecoder:
    """The speech decoder a plan (``qtts.plan.Plan``, dict, path or None) names; used by the runtime.

    ``checkpoint_loader()`` returns a loaded Checkpoint; it is only called for torch. ``threads``:
    intra-op threads where the plan entry sets none.
    """
    from .plan import Plan, load_plan

    plan = plan if isinstance(plan, Plan) else load_plan(plan)
    spec = plan.get("speech_decoder")
    if spec.impl != "torch":
        return make_decoder(spec, threads=threads)
    source = checkpoint_loader() if checkpoint_loader is not None else snapshot_dir
    dec = _torch_decoder(source)
    if next(dec.parameters()).dtype != _torch_float32():
        log.info("speech decoder is not fp32: using the offline decoder instead of the fp32 step")
        return TorchFullDecoder(dec)
    return make_decoder(spec, dec, threads)


def _torch_float32():
    return require("torch", "torch", "the torch vocoder").float32
