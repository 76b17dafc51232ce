"""Which vocoder a cached preset runs (issue 36): the bf16 step where the CPU runs bf16 natively."""

from __future__ import annotations

import pytest

from qtts.plans import plan as plans
from qtts.plans.plan import BF16_VOCODER_ENV, ComponentSpec, Plan, bf16_vocoder_runs_here, with_bf16_vocoder

ONNX_FP32 = Plan({"vocoder": ComponentSpec("vocoder", "onnx", {"main": "/b/voc8.onnx"}, precision="fp32"),
                  "talker": ComponentSpec("talker", "onnx", {"main": "/b/t.onnx"}, precision="int8")},
                 path="/b/plan.json")  # fmt: skip


@pytest.mark.parametrize("preset", ["fast", "fastest"])
def test_a_bf16_cpu_runs_the_bf16_step_in_the_fast_presets(monkeypatch, preset):
    monkeypatch.setattr(plans, "bf16_vocoder_runs_here", lambda: True)
    out = with_bf16_vocoder(ONNX_FP32, preset)
    voc = out.get("vocoder")
    assert (voc.impl, voc.precision, voc.options["precision"]) == ("torch", "bf16", "bf16")
    assert out.get("talker") == ONNX_FP32.get("talker") and out.path == ONNX_FP32.path


@pytest.mark.parametrize("preset", ["faithful", None])
def test_faithful_and_named_plans_keep_their_vocoder(monkeypatch, preset):
    monkeypatch.setattr(plans, "bf16_vocoder_runs_here", lambda: True)
    assert with_bf16_vocoder(ONNX_FP32, preset) is ONNX_FP32


def test_a_cpu_without_bf16_keeps_the_onnx_vocoder(monkeypatch):
    monkeypatch.setattr(plans, "bf16_vocoder_runs_here", lambda: False)
    assert with_bf16_vocoder(ONNX_FP32, "fast") is ONNX_FP32


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(BF16_VOCODER_ENV, "0")
    assert bf16_vocoder_runs_here() is False


def test_the_torch_free_answer_is_no_only_where_the_full_one_is(monkeypatch):
    """bf16_vocoder_may_run_here (no torch import) says no where bf16_vocoder_runs_here does: switched off, and
    never where the full answer is yes."""
    monkeypatch.setenv(BF16_VOCODER_ENV, "off")
    assert plans.bf16_vocoder_may_run_here() is False
    monkeypatch.delenv(BF16_VOCODER_ENV)
    assert plans.bf16_vocoder_may_run_here() or not bf16_vocoder_runs_here()


@pytest.mark.parametrize(("preset", "may", "starts"), [("fast", True, True), ("fastest", True, True),
                                                      ("faithful", True, False), (None, True, False),
                                                      ("fast", False, False)])  # fmt: skip
def test_open_imports_torch_meanwhile_only_where_the_bf16_step_may_be_chosen(monkeypatch, preset, may, starts):
    """qtts.backends.open starts torch's import on a thread of its own (it runs while onnxruntime builds the
    generation sessions) where with_bf16_vocoder may choose the bf16 step, and nowhere else."""
    import qtts.backends as backends

    started: list[str] = []

    class Thread:
        def __init__(self, target, name, daemon):
            assert target is backends._import_torch and daemon
            self.name = name

        def start(self):
            started.append(self.name)

    monkeypatch.setattr(backends.threading, "Thread", Thread)
    monkeypatch.setattr(plans, "bf16_vocoder_may_run_here", lambda: may)
    backends._import_torch_meanwhile(ONNX_FP32, preset)
    assert started == (["qtts-import-torch"] if starts else [])
    started.clear()
    torch_vocoder = Plan({"vocoder": ComponentSpec("vocoder", "torch", {}, precision="bf16")}, path="/b/plan.json")
    backends._import_torch_meanwhile(torch_vocoder, preset)  # nothing to choose: the plan names torch already
    assert started == []
