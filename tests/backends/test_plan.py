"""Execution plan JSON: schema validation with clear errors, relative paths, defaults."""

from __future__ import annotations

import json

import pytest

from qtts.errors import InputError
from qtts.plans.plan import COMPONENTS, Plan, load_plan, parse_plan, plan_snippet


@pytest.fixture
def plan_dir(tmp_path):
    (tmp_path / "art").mkdir()
    for name in ("voc16.onnx", "voc2.onnx", "talker.onnx"):
        (tmp_path / "art" / name).write_bytes(b"x")
    return tmp_path


def _write(d, data) -> str:
    path = d / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_valid_plan_resolves_relative_paths(plan_dir):
    path = _write(plan_dir, {
        "version": 1,
        "vocoder": {"impl": "onnx", "artifacts": {"main": "art/voc16.onnx", "first": "art/voc2.onnx"},
                    "options": {"threads": 2}},
        "talker": {"impl": "onnx", "artifacts": {"main": str(plan_dir / "art" / "talker.onnx")}, "precision": "int8"},
    })  # fmt: skip
    plan = load_plan(path)
    dec = plan.get("vocoder")
    assert dec.impl == "onnx" and dec.artifact("main") == str(plan_dir / "art" / "voc16.onnx")
    assert dec.artifact("first") == str(plan_dir / "art" / "voc2.onnx") and dec.options["threads"] == 2
    assert plan.get("talker").precision == "int8"
    assert plan.impl("predictor") == "torch"  # unnamed components run on torch
    assert plan.path == str(plan_dir / "plan.json")
    again = parse_plan(plan.to_dict(), "/")
    assert again.get("vocoder").artifacts == dec.artifacts


def test_legacy_component_names_still_load(plan_dir):
    """Plans written before the rename: code_predictor -> predictor, speech_decoder -> vocoder."""
    plan = load_plan(_write(plan_dir, {
        "code_predictor": {"impl": "torch"},
        "speech_decoder": {"impl": "onnx", "artifacts": {"main": "art/voc16.onnx"}},
    }))  # fmt: skip
    assert set(plan.components) == {"predictor", "vocoder"}
    assert plan.get("vocoder").artifact("main") == str(plan_dir / "art" / "voc16.onnx")
    assert "code_predictor" not in plan.to_dict()  # written back under today's names
    both = {"vocoder": {"impl": "torch"}, "speech_decoder": {"impl": "torch"}}
    with pytest.raises(InputError, match="name the same component"):
        load_plan(_write(plan_dir, both))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "JSON object"),
        ({"decoder": {"impl": "onnx"}}, "unknown component 'decoder'"),
        (
            {"vocoder": {"impl": "tensorrt", "artifacts": {"main": "art/voc16.onnx"}}},
            "'impl' must be one of",
        ),
        ({"vocoder": {"impl": "onnx"}}, "needs artifacts.main"),
        ({"vocoder": {"impl": "onnx", "artifacts": {"main": "art/none.onnx"}}}, "not found"),
        ({"vocoder": {"impl": "onnx", "artifacts": ["art/voc16.onnx"]}}, "'artifacts' must map"),
        ({"vocoder": {"impl": "onnx", "artifacts": {"main": 3}}}, "'artifacts' must map"),
        ({"vocoder": {"impl": "torch", "options": [1]}}, "'options' must be an object"),
        ({"vocoder": {"impl": "torch", "device": "npu"}}, "unknown keys"),
        ({"vocoder": "onnx"}, "expected an object"),
        ({"version": 7}, "unsupported plan version"),
    ],
)
def test_invalid_plans_name_the_problem(plan_dir, data, message):
    with pytest.raises(InputError, match=message):
        load_plan(_write(plan_dir, data))


def test_not_json_and_missing_file(plan_dir):
    bad = plan_dir / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_plan(str(bad))
    with pytest.raises(InputError, match="plan file not found"):
        load_plan(str(plan_dir / "nope.json"))


def test_defaults_and_snippet(plan_dir):
    empty = load_plan(None)
    assert isinstance(empty, Plan) and all(empty.impl(c) == "torch" for c in COMPONENTS)
    with pytest.raises(InputError, match="unknown component"):
        empty.get("speech_decoder")  # only today's names inside qtts
    snippet = json.loads(plan_snippet("vocoder", "rknn", {"main": "v.rknn"}))
    assert snippet == {"vocoder": {"impl": "rknn", "artifacts": {"main": "v.rknn"}}}


@pytest.mark.parametrize("plan,env", [("torch", "fast"), (None, "torch")])
def test_an_explicit_torch_plan_needs_no_plan_cache(tiny_snapshot, monkeypatch, plan, env):
    """plan="torch" (or none with $QTTS_PLAN=torch) is the empty Plan without the plan cache; any other
    plan still goes through it."""
    from qtts import backends
    from qtts.plans import cache
    from qtts.plans import plan as plan_module

    def refuse(*args, **kwargs):
        raise AssertionError("the plan cache was asked")

    monkeypatch.setenv("QTTS_PLAN", env)
    monkeypatch.setattr(cache, "resolve_plan", refuse)
    parts = backends.open(tiny_snapshot(), plan=plan, threads=1, parts=("vocoder",))
    assert parts.plan == Plan() and plan_module.names_torch(plan)
    assert not plan_module.names_torch("fast") and not plan_module.names_torch({"vocoder": {"impl": "torch"}})
    with pytest.raises(AssertionError, match="plan cache was asked"):
        backends.open(tiny_snapshot(), plan="fast", threads=1, parts=("vocoder",))
