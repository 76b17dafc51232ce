"""Weight recipes (qtts export onnx --mix / --repair): parsing, selection, errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qtts.errors import InputError
from qtts.export.recipe import KINDS, WeightId, make_recipe, parse_repair, parse_rules


def _ids(talker_layers: int = 6, predictor_layers: int = 2) -> list:
    out = [WeightId("talker", "head"), WeightId("predictor", "proj")]
    out += [WeightId("talker", k, layer=i) for i in range(talker_layers) for k in KINDS]
    out += [WeightId("predictor", k, layer=i) for i in range(predictor_layers) for k in KINDS]
    return out + [WeightId("predictor", "head", codebook=c) for c in range(1, 16)]


def _recipe(mix: str, base: str = "int4", repair: str = "") -> object:
    return replace(make_recipe(base, base, mix, repair), layers={"talker": 6, "predictor": 2})


def _selected(mix: str) -> set:
    r = _recipe(mix)
    return {(w.component, w.kind, w.layer, w.codebook) for w in _ids() if r.precision(w) == "int8"}


def test_layer_groups_select_what_they_name():
    assert _selected("talker.first2=int8") == {("talker", k, i, None) for i in (0, 1) for k in KINDS}
    assert _selected("talker.last1.mlp=int8") == {("talker", "gate_up", 5, None), ("talker", "down", 5, None)}
    assert _selected("talker.layers2-3.o=int8") == {("talker", "o", 2, None), ("talker", "o", 3, None)}
    assert _selected("predictor.attn=int8") == {("predictor", k, i, None) for i in (0, 1) for k in ("qkv", "o")}
    assert _selected("talker.layer4.qkv=int8") == {("talker", "qkv", 4, None)}


def test_heads_and_projection_selectors():
    assert _selected("talker.head=int8") == {("talker", "head", None, None)}
    assert _selected("predictor.heads9-15=int8") == {("predictor", "head", None, c) for c in range(9, 16)}
    assert _selected("predictor.head3=int8") == {("predictor", "head", None, 3)}
    assert _selected("predictor.proj=int8") == {("predictor", "proj", None, None)}
    assert len(_selected("predictor.heads=int8")) == 15
    whole = _selected("predictor=int8")
    assert len(whole) == 1 + 2 * len(KINDS) + 15 and not any(c == "talker" for c, *_ in whole)


def test_last_rule_wins_and_base_precision_applies_elsewhere():
    r = _recipe("talker=int8,talker.attn=fp32")
    assert r.precision(WeightId("talker", "qkv", layer=0)) == "fp32"
    assert r.precision(WeightId("talker", "down", layer=0)) == "int8"
    assert r.precision(WeightId("predictor", "down", layer=0)) == "int4"
    assert r.as_dict() == {"talker": "int4", "predictor": "int4", "mix": ["talker=int8", "talker.attn=fp32"],
                           "repair": []}  # fmt: skip
    assert r.uniform("predictor") and not r.uniform("talker")


@pytest.mark.parametrize("mix, words", [
    ("vocoder=int8", "unknown component 'vocoder'"),
    ("talker.first2", "expected SELECTOR=PRECISION"),
    ("talker.first2=int3", "expected SELECTOR=PRECISION"),
    ("talker.bogus=int8", "unknown part 'bogus'"),
    ("talker.layers3-1=int8", "range 3-1 is empty"),
    ("predictor.heads0-4=int8", "numbered by codebook, 1..15"),
    ("predictor.heads9-16=int8", "numbered by codebook, 1..15"),
    ("talker.first2.last2=int8", "two layers parts"),
    ("predictor.heads.first1=int8", "heads are not in layers"),
    ("talker.heads=int8", "unknown part 'heads'"),
    ("talker.proj=int8", "unknown part 'proj'"),
    ("talker.first0=int8", "unknown part 'first0'"),
])  # fmt: skip
def test_bad_rules_name_the_problem(mix, words):
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(".", r"\.")):
        parse_rules(mix)


def test_repair_parsing():
    assert parse_repair("mse,awq") == ("awq", "mse") and parse_repair("none") == () and parse_repair("") == ()
    with pytest.raises(InputError, match="unknown method 'gptq'"):
        parse_repair("awq,gptq")
    with pytest.raises(InputError, match="unknown talker weight precision 'int2'"):
        make_recipe("int2", "int8")


def test_a_rule_selecting_nothing_is_refused_at_export(snapshot, tmp_path, capsys):
    from qtts.cli import main as qtts_main

    out = str(tmp_path / "b")
    assert qtts_main(["export", "onnx", "-m", snapshot, "-o", out, "--weights", "int4", "--mix", "talker.layers7=int8",
                      "--components", "talker", "predictor", "--no-batch-graphs"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "talker.layers7=int8' selects no talker weight (talker: 2 layers)" in err
    assert qtts_main(["export", "onnx", "-m", snapshot, "-o", out, "--mix", "talker.x=int8"]) == 2
    assert "unknown part 'x'" in capsys.readouterr().err
