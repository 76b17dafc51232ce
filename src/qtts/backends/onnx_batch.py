"""The onnxruntime backend for a batched engine (:mod:`qtts.engine.batching`): one KV pool, the batch graphs.

:class:`OnnxBatchBackend` runs a bundle's batch graphs (``artifacts["batch"]`` of the talker and the
predictor, see :mod:`qtts.export.batch`) instead of the one-stream graphs, so the weights are held
once. Talker KV: a :class:`KVPool`, per layer and kind one ``[rows, kv_heads, capacity, head_dim]``
array; a stream owns one row (its state is a :class:`PoolRow`). A prefill runs the graph at batch 1
on that row's memory; a batch step runs rows ``0 .. hi`` (``hi`` = the highest row in the step) with
each row's own ``seqlens_k``, rows bound as past *and* present so GroupQueryAttention writes the new
slot in place. A row in that range that is not in the step gets a zero vector at its next position
(a slot its real step overwrites before reading it; a free row writes its slot 0), and its outputs are
dropped. Rows are handed out lowest first, so active streams sit together. The capacity grows
(doubling, rows copied) when a stream reaches it, so memory follows the longest running stream.

**Batch invariance.** onnxruntime's MatMulNBits (the int8 / int4 weights of the ``fast`` and
``fastest`` presets) computes rows two at a time; a row computed on its own (one row, or the last of
an odd count) differs from a paired row in the last bits, and a near-tie between two logits then
picks another code. Paired rows do not depend on their partner. So every talker step and predictor
frame here runs an even number of rows (an idle row or a repeated row makes up an odd count): a
stream's rows are the same computation alone (a batch of one) and in a batch of any size. (The
one-stream engine of ``qtts.load`` keeps its one-stream graphs, one row per call: running them on
paired rows cost 5-40 % per frame in the measurements of docs/performance.md, "Batch invariance".)
"""

from __future__ import annotations

import logging
import os

import numpy as np

from ..config import PREDICTOR_STEPS
from ..errors import InputError
from ..plans.plan import read_manifest
from .onnx import OnnxBackend
from .onnx import open_generation as open_one_stream

log = logging.getLogger(__name__)

#: KV capacity granularity (positions); growth at least doubles
CAPACITY_STEP = 64


class PoolRow:
    """One stream's talker state in a :class:`KVPool` (its row index and next position)."""

    __slots__ = ("index", "next_pos", "max_len")

    def __init__(self, index: int, max_len: int):
        self.index, self.next_pos, self.max_len = index, 0, max_len


class KVPool:
    """Per-layer K/V arrays shared by the streams of one batched engine, one row per stream."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, rows: int, max_positions: int):
        self.layers, self.kv_heads, self.head_dim, self.rows = layers, kv_heads, head_dim, rows
        self.max_positions = max_positions
        self.capacity = 0
        self.arrays: list[np.ndarray] = []  # key_0, value_0, key_1, ...
        self.version = 0  # bumped when the arrays are replaced (bindings hold their pointers)
        self.owners: dict[int, PoolRow] = {}

    def acquire(self, max_len: int) -> PoolRow:
        free = [i for i in range(self.rows) if i not in self.owners]
        if not free:
            raise RuntimeError(f"all {self.rows} KV rows are in use; release a stream's state first")
        if max_len > self.max_positions:
            raise InputError(f"max_len {max_len} exceeds the talker's {self.max_positions} positions")
        row = PoolRow(free[0], int(max_len))
        self.owners[row.index] = row
        return row

    def release(self, row: PoolRow) -> None:
        if self.owners.get(row.index) is row:
            del self.owners[row.index]

    def ensure(self, positions: int) -> None:
        """Room for ``positions`` slots per row (grows and copies the used part of every row)."""
        if positions <= self.capacity:
            return
        want = max(positions, 2 * self.capacity)
        cap = min(-(-want // CAPACITY_STEP) * CAPACITY_STEP, self.max_positions)
        if positions > cap:
            raise InputError(f"position {positions - 1} exceeds the talker's {self.max_positions} positions")
        shape = (self.rows, self.kv_heads, cap, self.head_dim)
        new = [np.zeros(shape, dtype=np.float32) for _ in range(2 * self.layers)]
        used = max((r.next_pos for r in self.owners.values()), default=0)
        for old, arr in zip(self.arrays, new):
            arr[:, :, :used] = old[:, :, :used]
        self.arrays, self.capacity = new, cap
        self.version += 1
        log.debug("talker KV pool: %d rows x %d positions", self.rows, cap)

    def row_bytes(self) -> int:
        return self.kv_heads * self.capacity * self.head_dim * 4


class OnnxBatchBackend(OnnxBackend):
    """The batch graphs of a bundle behind the :class:`~qtts.backends.base.Backend` seam, plus
    ``talker_rows`` / ``predict_frames`` (many streams per call) and ``release``."""

    thread_safe = False  # one engine thread drives it (qtts.engine.batching)

    def __init__(self, artifacts: dict, meta: dict, threads: int | None = None, max_batch: int = 8):
        super().__init__(artifacts, meta, threads=threads)
        t = meta["talker"]
        rows = _even(int(max_batch))  # room for the idle row that makes up an odd step
        self.pool = KVPool(t["layers"], t["kv_heads"], t["head_dim"], rows, len(self.rope_cos))
        self._bindings: dict = {}
        self.vocab = int(self.predictor_tables.shape[1])

    # -- talker ----------------------------------------------------------------------------------------
    def new_state(self, max_len: int) -> PoolRow:
        return self.pool.acquire(int(max_len))

    def release(self, state: PoolRow) -> None:
        self.pool.release(state)

    def talker(self, embeds: np.ndarray, pos: int, state: PoolRow):
        """Prefill (or one step) of one stream on its own row, at batch 1."""
        x = np.ascontiguousarray(np.asarray(embeds, dtype=np.float32)[None])
        t = x.shape[1]
        self._check(state, pos, t)
        logits, hidden = self._run(("row", state.index), x, np.array([pos + t - 1], np.int32), pos + t)
        state.next_pos = pos + t
        return logits[0], hidden[0], state

    def talker_rows(self, embeds: np.ndarray, positions: list, states: list):
        """One step of ``B`` streams, each on its own row at its own position."""
        hi = min(_even(max(s.index for s in states) + 1), self.pool.rows)
        x = np.zeros((hi, 1, self.hidden_size), dtype=np.float32)
        seqlens = np.zeros(hi, dtype=np.int32)
        for (
            index,
            row,
        ) in self.pool.owners.items():  # rows not in this step: a dropped write at their next slot
            if index < hi:
                seqlens[index] = row.next_pos
        for i, (state, pos) in enumerate(zip(states, positions)):
            self._check(state, int(pos), 1)
            x[state.index, 0] = embeds[i]
            seqlens[state.index] = int(pos)
        self.pool.ensure(int(seqlens.max()) + 1)
        logits, hidden = self._run(("rows", hi), x, seqlens, int(seqlens.max()) + 1)
        for state, pos in zip(states, positions):
            state.next_pos = int(pos) + 1
        rows = [s.index for s in states]
        return logits[rows], hidden[rows], states

    def _check(self, state: PoolRow, pos: int, t: int) -> None:
        if pos < 0 or pos + t > state.max_len:
            raise InputError(f"positions {pos}..{pos + t - 1} do not fit a KV state of {state.max_len} slots")
        self.pool.ensure(pos + t)

    def _run(self, key: tuple, x: np.ndarray, seqlens: np.ndarray, total: int):
        io = self._binding(key)
        io.bind_cpu_input("embeds", x)
        io.bind_cpu_input("seqlens_k", seqlens)
        io.bind_cpu_input("total_len", np.array(total, dtype=np.int32))
        self.talker_sess.run_with_iobinding(io)
        logits, hidden = io.get_outputs()[:2]
        return logits.numpy(), hidden.numpy()

    def _binding(self, key: tuple):
        """An I/O binding of rows ``0..hi-1`` (key ("rows", hi)) or of one row (("row", r)) of the pool."""
        pool = self.pool
        full = (key, pool.version)
        if full not in self._bindings:
            if len(self._bindings) > 4 * pool.rows:
                self._bindings.clear()
            first, count = (0, key[1]) if key[0] == "rows" else (key[1], 1)
            io = self.talker_sess.io_binding()
            cos = np.ascontiguousarray(self.rope_cos[: pool.capacity])
            sin = np.ascontiguousarray(self.rope_sin[: pool.capacity])
            io.bind_cpu_input("cos_cache", cos)
            io.bind_cpu_input("sin_cache", sin)
            io.bind_output("logits")
            io.bind_output("hidden")
            shape = [count, pool.kv_heads, pool.capacity, pool.head_dim]
            for i, arr in enumerate(pool.arrays):
                layer, kind = divmod(i, 2)
                kind = ("key", "value")[kind]
                ptr = arr.ctypes.data + first * pool.row_bytes()
                io.bind_input(f"past_{kind}_{layer}", "cpu", 0, np.float32, shape, ptr)
                io.bind_output(f"present_{kind}_{layer}", "cpu", 0, np.float32, shape, ptr)
            self._bindings[full] = (io, cos, sin)  # the tables are bound by pointer: keep them alive
        return self._bindings[full][0]

    # -- predictor ---------------------------------------------------------------------------------------
    def predict_frame(self, hidden, code0, sampler, uniforms) -> np.ndarray:
        return self.predict_frames(np.asarray(hidden, np.float32)[None], np.array([code0]), [sampler],
                                   np.asarray(uniforms)[None])[0]  # fmt: skip

    def predict_frames(
        self, hidden: np.ndarray, code0: np.ndarray, samplers: list, uniforms: np.ndarray
    ) -> np.ndarray:
        """Codes ``[B, 15]``: one graph run per set of sampling params (greedy rows join any run);
        the graph samples in-graph with the loop's uniforms and each sampler's params."""
        params = [s.params for s in samplers]
        groups: dict = {}
        for i, p in enumerate(params):
            groups.setdefault(self._sampler(p) if p.do_sample else None, []).append(i)
        greedy = groups.pop(None, [])
        if not groups:
            groups = {self._sampler(params[greedy[0]]): []}
        first = next(iter(groups))
        groups[first] = sorted(groups[first] + greedy)
        out = np.zeros((len(params), PREDICTOR_STEPS), dtype=np.int64)
        for (temperature, top_k, top_p), rows in groups.items():
            take = rows + rows[-1:] * (_even(len(rows)) - len(rows))  # an odd count: the last row twice
            feeds = {
                "hidden": np.ascontiguousarray(hidden[take], dtype=np.float32),
                "code0": np.asarray(code0, dtype=np.int64)[take],
                "uniforms": np.ascontiguousarray(uniforms[take], dtype=np.float32),
                "temperature": np.array([temperature], dtype=np.float32),
                "top_k": np.array([top_k], dtype=np.int64),
                "top_p": np.array([top_p], dtype=np.float32),
                "do_sample": np.array([bool(params[i].do_sample) for i in take]),
            }
            out[rows] = self.predictor_sess.run(["codes"], feeds)[0][: len(rows)]
        return out

    def _sampler(self, p) -> tuple:
        top_k = int(p.top_k) if p.top_k else self.vocab
        return (
            float(p.temperature or 1.0),
            min(max(top_k, 1), self.vocab),
            1.0 if p.top_p is None else float(p.top_p),
        )


def _even(n: int) -> int:
    return n + n % 2


def open_generation(talker_spec, predictor_spec, ctx):
    """The generation opener of an onnx plan when ``ctx.max_batch`` > 1: the batch graphs when the
    bundle has them (frame-mode predictor), else the one-stream backend (streams stepped one by one)."""
    talker_batch, predictor_batch = talker_spec.artifacts.get("batch"), predictor_spec.artifacts.get("batch")
    bundle = os.path.dirname(talker_spec.artifacts["main"])
    manifest = read_manifest(bundle)
    meta = dict(manifest["graphs"])
    if not (talker_batch and predictor_batch and meta.get("predictor", {}).get("mode") == "frame"):
        log.warning("this bundle has no batch graphs (exported before batching, or a step-mode predictor): "
                    "a batched engine steps its streams one by one; re-export it with `qtts export onnx`")
        return open_one_stream(talker_spec, predictor_spec, ctx)
    artifacts = {k: os.path.join(bundle, v) for k, v in manifest["runtime_files"].items()}
    artifacts.update(talker=talker_batch, predictor=predictor_batch)
    threads = talker_spec.options.get("threads", ctx.threads)
    return OnnxBatchBackend(artifacts, meta, threads=threads, max_batch=ctx.max_batch)
