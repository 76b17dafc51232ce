"""The ExecuTorch runtime (XNNPACK ``.pte`` files of ``qtts export executorch``).

* generation: :class:`EtBackend`. Embedding rows are numpy tables (``tables/*.npy``, like the
  ONNX bundle); the text projection, the talker step and the predictor step are ``.pte``
  methods. Talker: one position per call with the whole fixed-size KV cache in and out
  (``[layers, 2, kv_heads, max_len, head_dim]``), so a T-row prefill is T calls. Predictor: the
  plain 17-slot step driven by :class:`~qtts.backends.plain.PlainPredictor` (host-side sampling).
* vocoder: :class:`EtVocoder`, the B-frame vocoder step (flat cache in and out) with the step
  schedule of :mod:`qtts.backends.vocoder_step`; its contract is the ``.json`` beside the ``.pte``.

Needs the ``executorch`` package (``pip install -e ".[executorch]"``; the project keeps it in its
own ``.venv-et``, ``scripts/setup_executorch_env.sh``), and torch, whose tensors the Python
bindings take. Imported only when a plan names ``impl: executorch``.

Plan entries (``options``: ``threads``, the XNNPACK thread pool, one per process)::

    {"talker": {"impl": "executorch", "artifacts": {"main": "talker.fp32.pte"}},
     "predictor": {"impl": "executorch", "artifacts": {"main": "predictor_step.fp32.pte"}},
     "vocoder": {"impl": "executorch", "artifacts": {"main": "vocoder.b4.pte"}}}
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ..config import NUM_CODEBOOKS
from ..errors import InputError, require
from ..plans.plan import load_table, read_manifest
from .base import Backend, OpenContext
from .plain import PlainPredictor
from .vocoder_step import StepContract, StepVocoder

log = logging.getLogger(__name__)

_HINT = "the ExecuTorch runtime (pip install -e \".[executorch]\", or scripts/setup_executorch_env.sh)"


def load_method(path: str, threads: int | None = 1):
    """The ``forward`` method of a .pte (XNNPACK thread pool reset to ``threads``)."""
    rt = require("executorch.runtime", "executorch", _HINT)
    if not os.path.isfile(path):
        raise InputError(f"{path}: .pte file not found; re-run 'qtts export executorch' or fix the plan")
    if threads:
        portable = require("executorch.extension.pybindings.portable_lib", "executorch", _HINT)
        portable._unsafe_reset_threadpool(int(threads))
    return rt.Runtime.get().load_program(path).load_method("forward")


def method_runner(method):
    """numpy-in/numpy-out ``run(*arrays)`` over an ExecuTorch method (outputs copied out)."""
    torch = require("torch", "executorch", _HINT)

    def tensor(a):  # torch needs writable memory: a read-only table row (memory-mapped) is copied
        a = np.asarray(a)
        return torch.from_numpy(a if a.flags.writeable and a.flags.c_contiguous else np.array(a, order="C"))

    def run(*arrays):
        outs = method.execute([tensor(a) for a in arrays])
        return [np.array(o.numpy()) for o in outs]

    return run


class EtBackend(Backend):
    """Talker + predictor in ExecuTorch; implements :class:`~qtts.backends.base.Backend`."""

    thread_safe = False  # one method instance per step: generations must not interleave

    def __init__(self, talker: str, predictor: str, files: dict, meta: dict, threads: int | None = 1):
        """``talker``/``predictor``: .pte paths; ``files``: tables + text projection (absolute);
        ``meta``: the manifest's ``graphs``."""
        load = lambda key: np.ascontiguousarray(load_table(files[key]), dtype=np.float32)  # noqa: E731
        self.text_table = load_table(files["text_embedding"])
        self.codec_table = load("codec_embedding")
        self.predictor_tables = load("predictor_codec_embedding")
        self.hidden_size = int(self.codec_table.shape[1])
        self.kv_shape = tuple(int(d) for d in meta["talker"]["kv"])
        self.max_len = self.kv_shape[3]
        self._text = method_runner(load_method(files["text_projection"], threads))
        self._talker = method_runner(load_method(talker, threads))
        run = method_runner(load_method(predictor, threads))
        self.plain = PlainPredictor(run, self.codec_table, self.predictor_tables, meta["predictor"]["kv"])

    def text_embeds(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.zeros((len(ids), self.hidden_size), np.float32)
        for i, row in enumerate(self.text_table[ids]):
            out[i] = self._text(np.asarray(row, dtype=np.float32)[None])[0][0]
        return out

    def codec_embeds(self, ids: np.ndarray) -> np.ndarray:
        return self.codec_table[np.asarray(ids, dtype=np.int64).reshape(-1)]

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.int64).reshape(-1, NUM_CODEBOOKS)
        parts = [self.codec_table[codes[:, 0]]]
        parts += [self.predictor_tables[j][codes[:, j + 1]] for j in range(codes.shape[1] - 1)]
        return np.stack(parts, axis=1).sum(axis=1, dtype=np.float32)

    def new_state(self, max_len: int) -> np.ndarray:
        """A zero KV cache of the exported ``max_len`` slots (a longer request fails only when a
        position past them is reached, with the re-export hint)."""
        if int(max_len) > self.max_len:
            log.debug("generation budget %d > the exported %d talker slots", max_len, self.max_len)
        return np.zeros(self.kv_shape, np.float32)

    def talker(self, embeds: np.ndarray, pos: int, state: np.ndarray):
        rows = np.asarray(embeds, dtype=np.float32).reshape(-1, self.hidden_size)
        if pos < 0 or pos + len(rows) > self.max_len:
            raise InputError(
                f"positions {pos}..{pos + len(rows) - 1} do not fit the talker's {self.max_len} exported KV "
                "slots; re-export with a larger 'qtts export executorch --max-len'"
            )
        logits = hidden = None
        for t, row in enumerate(rows):
            logits, hidden, state = self._talker(row.reshape(1, 1, -1), np.array([pos + t], np.int64), state)
        return logits[0], hidden[0], state

    def predict_frame(self, hidden: np.ndarray, code0: int, sampler, uniforms: np.ndarray) -> np.ndarray:
        return self.plain.predict_frame(hidden, code0, sampler, uniforms)

    def predictor_logits(self, hidden, code0: int, sampler, uniforms):
        """(codes [15], logits [15, vocab]) of one frame, for ``qtts verify plan``."""
        return self.plain.predictor_logits(hidden, code0, sampler, uniforms)


def read_contract(pte: str) -> StepContract:
    """The step contract of a vocoder ``.pte``: the ``.json`` of the same name beside it."""
    path = os.path.splitext(pte)[0] + ".json"
    try:
        with open(path, encoding="utf-8") as fh:
            return StepContract.from_dict(json.load(fh), path)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the vocoder step contract ({exc}); re-export the bundle") from exc


class EtVocoder(StepVocoder):
    """The streaming vocoder over one ExecuTorch vocoder step (zero-padded remainders)."""

    def __init__(self, path: str, contract: StepContract | None = None, threads: int | None = 1):
        self._run_step = method_runner(load_method(path, threads))
        self.contract = contract or read_contract(path)
        self.sizes = [self.contract.codes_length]

    def run(self, size, codes, freqs, valid, cache):
        audio, cache = self._run_step(codes, freqs, valid, cache)
        return audio, cache


def open_generation(talker_spec, predictor_spec, ctx: OpenContext) -> EtBackend:
    """The bundle manifest beside the talker step names the tables, the text projection and the shapes."""
    if talker_spec.impl != "executorch" or predictor_spec.impl != "executorch":
        raise InputError("an executorch plan must name both 'talker' and 'predictor' (impl: executorch)")
    bundle = os.path.dirname(talker_spec.artifacts["main"])
    manifest = read_manifest(bundle)
    if manifest.get("runtime") != "executorch":
        raise InputError(f"{bundle}: not an ExecuTorch bundle (manifest runtime {manifest.get('runtime')!r})")
    files = {k: os.path.join(bundle, v) for k, v in manifest["runtime_files"].items()}
    threads = talker_spec.options.get("threads", ctx.threads)
    return EtBackend(talker_spec.artifacts["main"], predictor_spec.artifacts["main"], files,
                     dict(manifest["graphs"]), threads=threads)  # fmt: skip


OPENERS = {
    "generation": open_generation,
    "vocoder": lambda spec, ctx: EtVocoder(spec.artifacts["main"], threads=spec.options.get("threads", ctx.threads)),
}
