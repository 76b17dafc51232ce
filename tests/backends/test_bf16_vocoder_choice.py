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
