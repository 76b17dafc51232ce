"""VocoderBatcher: many streams' vocoder steps on one thread. Each stream's audio equals the same
stream alone (bitwise with the default run_batch, for torch fp32 and bf16 and onnx; SNR-bounded
with torch's stacked steps); streams join and leave in the middle of another's call; a closed
stream frees its place at once; first chunks go ahead of later ones."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from qtts.audio import snr_db
from qtts.backends.vocoder_batch import VocoderBatcher, VocoderStreamClosed
from qtts.backends.vocoder_step import StepVocoder
from qtts.cli import main as qtts_main

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEDULES = [(1, 2, 4, 8), (3, 8), (2, 2, 7, 16), (1, 16)]


@pytest.fixture(scope="module")
def torch_steps(tiny_snapshot):
    from qtts.backends.torch import TorchVocoder
    from support.vocoder_fixtures import load_decoder

    return TorchVocoder(load_decoder(tiny_snapshot()), main=4)


@pytest.fixture(scope="module")
def bf16_steps(torch_steps):
    """The bf16 vocoder of the default plans (steps of 8, 4, 2, 1 frames, packed)."""
    from qtts.backends.torch import TorchVocoder

    return TorchVocoder(torch_steps.decoder, main=8, precision="bf16")


@pytest.fixture(scope="module")
def onnx_bundle(tiny_snapshot, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("vb") / "bundle")
    assert qtts_main(["export", "onnx", "-m", tiny_snapshot(), "-o", out, "--components", "vocoder",
                      "--vocoder-streams", "2"]) == 0  # fmt: skip
    return out


@pytest.fixture(scope="module")
def onnx_steps(onnx_bundle):
    from qtts.backends.onnx import OnnxVocoder

    return OnnxVocoder(f"{onnx_bundle}/vocoder.b8.onnx", f"{onnx_bundle}/vocoder.b1.onnx", threads=1)


class Counting:
    """A session that counts its runs."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def run(self, *args):
        self.runs += 1
        return self.session.run(*args)


def test_stacked_onnx_steps_are_bitwise_the_steps_one_by_one(onnx_bundle, onnx_steps, tiny_snapshot):
    import json

    from qtts.backends import open as open_parts

    with open(f"{onnx_bundle}/plan.json", encoding="utf-8") as fh:
        arts = json.load(fh)["vocoder"]["artifacts"]
    assert arts["main.s2"] == "vocoder.b8.s2.onnx" and "first.s2" not in arts
    stacked = open_parts(tiny_snapshot(), plan=f"{onnx_bundle}/plan.json", threads=1, parts=("vocoder",)).vocoder
    assert sorted(stacked.stacked) == [(8, 2)] and stacked.shared is not None
    stacked.stacked = {k: Counting(v) for k, v in stacked.stacked.items()}
    batcher = VocoderBatcher(stacked, max_streams=4)
    jobs = _jobs()
    for (codes, schedule), audio in zip(jobs, _together(batcher, jobs)):
        np.testing.assert_array_equal(audio, _alone(onnx_steps, codes, schedule))
    assert sum(c.runs for c in stacked.stacked.values()) > 0  # the stacked graphs really ran
    batcher.close()


def _codes(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (frames, 16))


def _chunks(codes, schedule):
    i, k = 0, 0
    while i < len(codes):
        n = schedule[min(k, len(schedule) - 1)]
        yield codes[i : i + n]
        i, k = i + n, k + 1


def _alone(steps, codes, schedule) -> np.ndarray:
    stream = steps.stream()
    return np.concatenate([stream.decode(c) for c in _chunks(codes, schedule)])


def _together(batcher, jobs) -> list:
    """Every (codes, schedule) job as one thread with its own batched stream, all at once."""
    out, errors, start = [None] * len(jobs), [], threading.Barrier(len(jobs))

    def run(i):
        try:
            stream = batcher.stream()
            start.wait()
            out[i] = np.concatenate([stream.decode(c) for c in _chunks(*jobs[i])])
            stream.close()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return out


def _jobs():
    return [(_codes(20 + 3 * i, seed=i), SCHEDULES[i]) for i in range(len(SCHEDULES))]


@pytest.mark.parametrize("kind", ["torch", "bf16", "onnx"])
def test_batched_streams_equal_each_stream_alone_bitwise(kind, torch_steps, bf16_steps, onnx_steps):
    steps = {"torch": torch_steps, "bf16": bf16_steps, "onnx": onnx_steps}[kind]
    calls = []
    batcher = VocoderBatcher(steps, max_streams=4, observer=calls.append)
    jobs = _jobs()
    together = _together(batcher, jobs)
    for (codes, schedule), audio in zip(jobs, together):
        np.testing.assert_array_equal(audio, _alone(steps, codes, schedule))
    assert max(c.streams for c in calls) > 1  # steps really were stacked
    assert batcher.active == 0
    batcher.close()


def test_stacked_torch_steps_stay_within_fp32_rounding(torch_steps):
    from qtts.backends.torch import TorchVocoder

    stacked = TorchVocoder(torch_steps.decoder, main=4, stack_streams=True)
    calls = []
    batcher = VocoderBatcher(stacked, max_streams=4, observer=calls.append)
    jobs = _jobs()
    for (codes, schedule), audio in zip(jobs, _together(batcher, jobs)):
        assert snr_db(_alone(torch_steps, codes, schedule), audio) > 80.0
    assert max(c.streams for c in calls) > 1
    batcher.close()


class Gated(StepVocoder):
    """Steps that wait for a go-ahead per call and record who was in each call."""

    def __init__(self, steps):
        self.steps, self.contract, self.sizes = steps, steps.contract, steps.sizes
        self.exact_remainder = steps.exact_remainder
        self.calls: list = []
        self.go = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)

    def _gate(self, size, rows):
        self.calls.append((size, rows))
        self.entered.release()
        assert self.go.acquire(timeout=60)

    def run(self, size, codes, freqs, valid, cache):
        self._gate(size, 1)
        return self.steps.run(size, codes, freqs, valid, cache)

    def run_batch(self, size, codes, freqs, valid, cache):
        self._gate(size, len(codes))
        return super().run_batch(size, codes, freqs, valid, cache)


def _start(fn, *args):
    box = {}

    def run():
        try:
            box["out"] = fn(*args)
        except Exception as exc:  # inspected by the test
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def test_streams_join_and_leave_in_the_middle_of_a_call(torch_steps):
    gated = Gated(torch_steps)  # main=4: a 12-frame decode is three steps
    batcher = VocoderBatcher(gated, max_streams=4)
    a, b, c = (batcher.stream() for _ in range(3))
    ca, cb, cc = _codes(12, 1), _codes(8, 2), _codes(12, 3)
    ta, box_a = _start(a.decode, ca)
    assert gated.entered.acquire(timeout=60)  # a's first step runs alone
    tb, box_b = _start(b.decode, cb)
    tc, box_c = _start(c.decode, cc)
    while len(batcher._jobs) < 3:
        threading.Event().wait(0.001)
    gated.go.release()
    assert gated.entered.acquire(timeout=60)  # b and c joined a's decode at its second step
    assert gated.calls[-1] == (4, 3)
    c.close()  # c leaves in the middle of its decode, while the call runs
    assert batcher.active == 2
    for _ in range(8):
        gated.go.release()
    for t in (ta, tb, tc):
        t.join(60)
    assert isinstance(box_c.get("error"), VocoderStreamClosed)
    np.testing.assert_array_equal(box_a["out"], _alone(torch_steps, ca, (12,)))
    np.testing.assert_array_equal(box_b["out"], _alone(torch_steps, cb, (8,)))
    assert all(rows <= 2 for _, rows in gated.calls[2:])  # c took no part after it left
    batcher.close()


def test_a_closed_stream_frees_its_place_at_once(torch_steps):
    gated = Gated(torch_steps)
    batcher = VocoderBatcher(gated, max_streams=1)
    a, b = batcher.stream(), batcher.stream()
    ta, box_a = _start(a.decode, _codes(4, 1))
    assert gated.entered.acquire(timeout=60)
    tb, box_b = _start(b.decode, _codes(4, 2))  # queued behind a's running call
    while not batcher._jobs or len(batcher._jobs) < 2:
        threading.Event().wait(0.001)
    b.close()
    tb.join(60)  # b's queued decode gives up now, before a's call ends
    assert isinstance(box_b.get("error"), VocoderStreamClosed)
    assert batcher.active == 1
    gated.go.release()
    ta.join(60)
    assert len(box_a["out"]) == 4 * gated.contract.samples_per_frame
    a.close()
    assert batcher.active == 0 and not batcher._jobs
    with pytest.raises(VocoderStreamClosed):
        a.decode(_codes(1, 0))
    batcher.close()


def test_first_chunks_go_ahead_of_later_ones(torch_steps):
    gated = Gated(torch_steps)
    batcher = VocoderBatcher(gated, max_streams=1)
    old, new, blocker = batcher.stream(), batcher.stream(), batcher.stream()
    gated.go.release()
    old.decode(_codes(3, 1))  # old has delivered audio: its next chunk is a later one
    tx, _ = _start(blocker.decode, _codes(2, 9))
    assert gated.entered.acquire(timeout=60)
    assert gated.entered.acquire(timeout=60)  # blocker's call is running
    t_old, _ = _start(old.decode, _codes(4, 2))
    while len(batcher._jobs) < 2:
        threading.Event().wait(0.001)
    t_new, box_new = _start(new.decode, _codes(1, 3))
    while len(batcher._jobs) < 3:
        threading.Event().wait(0.001)
    for _ in range(6):
        gated.go.release()
    for t in (tx, t_old, t_new):
        t.join(60)
    assert [size for size, _ in gated.calls[2:4]] == [1, 4]  # new's 1-frame first chunk, then old's
    assert old.margin_s() is not None and new.margin_s() is not None
    batcher.close()
