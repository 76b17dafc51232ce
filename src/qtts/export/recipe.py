"""Weight recipes: which precision each streamed weight of the talker and predictor graphs gets.

A :class:`Recipe` is a base precision per component (``--weights``, ``--talker-weights``,
``--predictor-weights``), then rules ``SELECTOR=PRECISION`` applied in order (the last rule that
selects a weight wins; ``qtts export onnx --mix``), then the repairs (``--repair awq,mse``).

Selectors are ``COMPONENT[.PART...]``, every part narrowing the selection:

* ``talker`` | ``predictor``: the whole component (layers and heads);
* layers: ``firstN``, ``lastN``, ``layerI`` or ``layersI-J`` (0-based, inclusive); ``layers`` = all;
* projections: ``attn`` (q/k/v and o), ``mlp`` (gate/up and down), or one of ``qkv``, ``o``,
  ``gate_up``, ``down``;
* heads: ``talker.head`` (the codec head), ``predictor.heads`` (all 15), ``predictor.headsI-J`` /
  ``predictor.headI`` (by the codebook the head predicts, 1..15: ``heads9-15`` = the late ones);
* ``predictor.proj``: ``small_to_mtp_projection`` (1.7B layouts only).

``talker.first2=int8,talker.last2=int8,predictor.heads9-15=int8`` keeps the first and last two
talker layers and the predictor's late heads at 8 bits. Graph weights are identified by their
initializer names (:func:`weight_id`), which are the export wrappers' parameter paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import InputError

PRECISIONS = ("fp32", "int8", "int4")
BITS = {"fp32": 32, "int8": 8, "int4": 4}
REPAIRS = ("awq", "mse", "rotate")
COMPONENTS = ("talker", "predictor")
KINDS = ("qkv", "o", "gate_up", "down")
_KIND_SETS = {"attn": ("qkv", "o"), "mlp": ("gate_up", "down"), **{k: (k,) for k in KINDS}}
GRAMMAR = ("COMPONENT[.PART...]=PRECISION with COMPONENT talker|predictor and PART one of firstN, lastN, "
           "layerI, layersI-J, layers, attn, mlp, qkv, o, gate_up, down, head (talker), heads, headI, headsI-J "
           "(predictor, codebooks 1-15), proj (predictor); PRECISION fp32|int8|int4")  # fmt: skip


@dataclass(frozen=True)
class WeightId:
    """One graph weight: component, layer (None for heads / proj), kind (qkv, o, gate_up, down, head, proj)
    and, for a predictor head, the codebook it predicts (1..15)."""

    component: str
    kind: str
    layer: int | None = None
    codebook: int | None = None


@dataclass(frozen=True)
class Selector:
    text: str
    component: str
    layers: tuple | None = None  # ("first", n) | ("last", n) | ("range", i, j) | ("all",)
    kinds: tuple | None = None  # projections; None = any
    heads: tuple | None = None  # (lo, hi) codebooks for predictor heads, (0, 0) for the talker head
    proj: bool = False

    def matches(self, w: WeightId, layers: int) -> bool:
        if w.component != self.component:
            return False
        if self.proj:
            return w.kind == "proj"
        if self.heads is not None:
            return w.kind == "head" and (w.codebook is None or self.heads[0] <= w.codebook <= self.heads[1])
        if self.layers is None and self.kinds is None:
            return True  # the whole component
        if w.layer is None:
            return False
        return (self.kinds is None or w.kind in self.kinds) and _in_layers(self.layers, w.layer, layers)


def _in_layers(spec, layer: int, n: int) -> bool:
    if spec is None or spec[0] == "all":
        return True
    if spec[0] == "first":
        return layer < spec[1]
    if spec[0] == "last":
        return layer >= n - spec[1]
    return spec[1] <= layer <= spec[2]


_RANGE = re.compile(r"^(first|last|layer|layers|head|heads)(\d+)(?:-(\d+))?$")


def parse_selector(text: str) -> Selector:
    parts = text.strip().split(".")
    comp = parts[0]
    if comp not in COMPONENTS:
        raise InputError(f"--mix '{text}': unknown component '{comp}'; expected {GRAMMAR}")
    fields: dict = {}
    for part in parts[1:]:
        _parse_part(text, comp, part, fields)
    if fields.get("heads") is not None and (fields.get("layers") or fields.get("kinds")):
        raise InputError(f"--mix '{text}': heads are not in layers; select heads and layers in two rules")
    return Selector(text.strip(), comp, **fields)


def _parse_part(text: str, comp: str, part: str, fields: dict) -> None:
    def put(key, value):
        if key in fields:
            raise InputError(f"--mix '{text}': two {key} parts; give one (or write two rules)")
        fields[key] = value

    m = _RANGE.match(part)
    if part in _KIND_SETS:
        put("kinds", _KIND_SETS[part])
    elif part == "layers":
        put("layers", ("all",))
    elif part == "head" and comp == "talker":
        put("heads", (0, 0))
    elif part == "heads" and comp == "predictor":
        put("heads", (1, 15))
    elif part == "proj" and comp == "predictor":
        put("proj", True)
    elif m and m.group(1) in ("first", "last") and m.group(3) is None and int(m.group(2)) > 0:
        put("layers", (m.group(1), int(m.group(2))))
    elif m and m.group(1) in ("layer", "layers"):
        lo, hi = int(m.group(2)), int(m.group(3) if m.group(3) is not None else m.group(2))
        put("layers", ("range", *_ordered(text, lo, hi)))
    elif m and m.group(1) in ("head", "heads") and comp == "predictor":
        lo, hi = _ordered(text, int(m.group(2)), int(m.group(3) if m.group(3) is not None else m.group(2)))
        if lo < 1 or hi > 15:
            raise InputError(f"--mix '{text}': predictor heads are numbered by codebook, 1..15")
        put("heads", (lo, hi))
    else:
        raise InputError(f"--mix '{text}': unknown part '{part}'; expected {GRAMMAR}")


def _ordered(text: str, lo: int, hi: int) -> tuple[int, int]:
    if hi < lo:
        raise InputError(f"--mix '{text}': range {lo}-{hi} is empty; write the lower number first")
    return lo, hi


@dataclass(frozen=True)
class Rule:
    selector: Selector
    precision: str

    @property
    def text(self) -> str:
        return f"{self.selector.text}={self.precision}"


def parse_rules(text: str | None) -> tuple[Rule, ...]:
    """``"talker.first2=int8,predictor.heads9-15=int8"`` -> rules (empty text -> none)."""
    rules = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        sel, eq, precision = item.partition("=")
        precision = precision.strip()
        if not eq or precision not in PRECISIONS:
            raise InputError(f"--mix '{item.strip()}': expected SELECTOR=PRECISION ({GRAMMAR})")
        rules.append(Rule(parse_selector(sel), precision))
    return tuple(rules)


def parse_repair(text: str | None) -> tuple[str, ...]:
    """``"awq,mse"`` -> ("awq", "mse"); ``None`` / ``"none"`` -> (); methods combine (``rotate,mse``)."""
    items = [x.strip() for x in (text or "").split(",") if x.strip() and x.strip() != "none"]
    bad = [x for x in items if x not in REPAIRS]
    if bad:
        raise InputError(f"--repair: unknown method '{bad[0]}'; use awq, mse, rotate, a comma-separated combination (rotate,mse) or none")
    return tuple(r for r in REPAIRS if r in items)


@dataclass(frozen=True)
class Recipe:
    talker: str = "fp32"
    predictor: str = "fp32"
    rules: tuple = ()
    repair: tuple = ()
    layers: dict = field(default_factory=dict, compare=False)  # component -> layer count, for last-N

    def base(self, component: str) -> str:
        return self.talker if component == "talker" else self.predictor

    def precision(self, w: WeightId) -> str:
        out = self.base(w.component)
        for rule in self.rules:
            if rule.selector.matches(w, self.layers.get(w.component, 0)):
                out = rule.precision
        return out

    def uniform(self, component: str) -> bool:
        return not any(r.selector.component == component for r in self.rules)

    def text(self) -> str:
        """The recipe as the CLI would take it (one line, for reports and the manifest)."""
        out = f"talker {self.talker}, predictor {self.predictor}"
        if self.rules:
            out += "; mix " + ",".join(r.text for r in self.rules)
        return out + ("; repair " + ",".join(self.repair) if self.repair else "")

    def as_dict(self) -> dict:
        return {"talker": self.talker, "predictor": self.predictor, "mix": [r.text for r in self.rules],
                "repair": list(self.repair)}  # fmt: skip


def make_recipe(talker: str, predictor: str, mix: str | None = None, repair: str | None = None) -> Recipe:
    for name, p in (("talker", talker), ("predictor", predictor)):
        if p not in PRECISIONS:
            raise InputError(f"unknown {name} weight precision '{p}'; use one of {', '.join(PRECISIONS)}")
    return Recipe(talker, predictor, parse_rules(mix), parse_repair(repair))


_LAYER = re.compile(r"^(?:step\.)?layers\.(\d+)\.(qkv|o|gate_up|down)$")
_HEAD = re.compile(r"^(?:step\.)?heads\.(\d+)$")


def weight_id(component: str, name: str) -> WeightId:
    """The :class:`WeightId` of a graph initializer (the export wrappers' parameter paths; the one
    unnamed constant MatMul weight of a predictor graph is ``small_to_mtp_projection``'s)."""
    m = _LAYER.match(name)
    if m:
        return WeightId(component, m.group(2), layer=int(m.group(1)))
    m = _HEAD.match(name)
    if m and component == "predictor":
        return WeightId(component, "head", codebook=int(m.group(1)) + 1)
    if name == "head" and component == "talker":
        return WeightId(component, "head")
    if component == "predictor":
        return WeightId(component, "proj")
    raise InputError(f"{component} graph weight '{name}' is none of the known projections; re-export with this qtts")


def check_rules(recipe: Recipe, ids: dict) -> None:
    """Every rule must select at least one weight of the graphs exported (``ids``: component -> WeightIds)."""
    for rule in recipe.rules:
        comp = rule.selector.component
        if comp in ids and not any(rule.selector.matches(w, recipe.layers.get(comp, 0)) for w in ids[comp]):
            n = recipe.layers.get(comp, 0)
            raise InputError(f"--mix '{rule.text}' selects no {comp} weight ({comp}: {n} layers); "
                             "fix the layer or head numbers, or drop the rule")  # fmt: skip


def component_ids(talker) -> dict:
    """component -> every WeightId of its graph, from the torch modules (the same names the graphs carry)."""
    out = {"talker": [WeightId("talker", "head")], "predictor": []}
    for comp, stack in (("talker", talker.model.layers), ("predictor", talker.code_predictor.model.layers)):
        out[comp] += [WeightId(comp, k, layer=i) for i in range(len(stack)) for k in KINDS]
    out["predictor"] += [WeightId("predictor", "head", codebook=j + 1) for j in range(len(talker.code_predictor.lm_head))]
    if not isinstance(talker.code_predictor.small_to_mtp_projection, _identity()):
        out["predictor"].append(WeightId("predictor", "proj"))
    return out


def _identity():
    from torch import nn

    return nn.Identity


def label(recipe: Recipe, component: str, talker) -> str:
    """The plan's informational precision of a component: ``int4``, or ``int4+int8`` for a mix."""
    used = sorted({recipe.precision(w) for w in component_ids(talker)[component]}, key=lambda p: BITS[p])
    return "+".join(used) if used else recipe.base(component)


def file_label(recipe: Recipe, component: str, talker) -> str:
    """:func:`label` as it goes into file names (``int4-int8``)."""
    return label(recipe, component, talker).replace("+", "-")


def for_talker(talker, talker_p: str, predictor_p: str, mix: str | None = None, repair: str | None = None) -> Recipe:
    """:func:`make_recipe` for this talker module: layer counts filled in, every rule checked to select a weight."""
    from dataclasses import replace

    layers = {"talker": len(talker.model.layers), "predictor": len(talker.code_predictor.model.layers)}
    recipe = replace(make_recipe(talker_p, predictor_p, mix, repair), layers=layers)
    check_rules(recipe, component_ids(talker))
    return recipe
