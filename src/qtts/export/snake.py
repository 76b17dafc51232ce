"""SnakeBeta chains of an exported vocoder step -> one ``qtts.kernels::SnakeBeta`` node each.

The TorchScript export of ``x + inv_b * sin(a * x)^2`` (:func:`qtts.model.vocoder.snake`) is five
nodes: ``Mul(x, a) -> Sin -> Mul(s, s) -> Mul(inv_b, s2) -> Add(x, .)``, five passes over the
activation, and onnxruntime's ``Sin`` is scalar and single-threaded. :func:`fuse_snake` replaces
each chain by one node that calls the model-local function ``qtts.kernels::SnakeBeta`` (ONNX IR 8
functions) whose body is those same five nodes. So the bundle stays portable:

* where the compiled kernel library (:mod:`qtts.kernels`) is registered with the session,
  onnxruntime runs its fused, vectorised kernel for the node;
* everywhere else onnxruntime inlines the function body: the plain graph's ops, and its output bit
  for bit (tests/export/test_snake_fusion.py).

Only the onnxruntime bundle's steps are rewritten (``ExportOptions.vocoder_kernels``); ``qtts
export vocoder`` (the RKNN / QNN input) stays plain.
"""

from __future__ import annotations

import logging
import os

from ..errors import require
from ..files import publish, temp_beside

log = logging.getLogger(__name__)

DOMAIN, OP = "qtts.kernels", "SnakeBeta"
_BODY_OPSET = 17


def snake_function():
    """The FunctionProto ``qtts.kernels::SnakeBeta(x, a, inv_b) -> y``: the plain five-node chain."""
    onnx = require("onnx", "export", "ONNX export")
    mk = onnx.helper.make_node
    nodes = [mk("Mul", ["x", "a"], ["v"]), mk("Sin", ["v"], ["s"]), mk("Mul", ["s", "s"], ["s2"]),
             mk("Mul", ["inv_b", "s2"], ["t"]), mk("Add", ["x", "t"], ["y"])]  # fmt: skip
    return onnx.helper.make_function(DOMAIN, OP, ["x", "a", "inv_b"], ["y"], nodes,
                                     [onnx.helper.make_opsetid("", _BODY_OPSET)])  # fmt: skip


def _coefficient(name: str, inits: dict) -> int | None:
    """C when ``name`` is a [1, C, 1] initializer, else None."""
    t = inits.get(name)
    return int(t.dims[1]) if t is not None and len(t.dims) == 3 and t.dims[0] == 1 and t.dims[2] == 1 else None


def _other(node, name: str) -> str | None:
    """The input of a two-input node that is not ``name`` (None if ``name`` is not one of them)."""
    ins = list(node.input)
    return ins[1 - ins.index(name)] if len(ins) == 2 and name in ins else None


class _Graph:
    def __init__(self, graph, shapes: dict):
        self.inits = {t.name: t for t in graph.initializer}
        self.shapes = shapes
        self.outputs = {o.name for o in graph.output}
        self.users: dict[str, list] = {}
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.users.setdefault(name, []).append(node)

    def only_user(self, name: str, op: str):
        users = self.users.get(name, [])
        ok = len(users) == 1 and users[0].op_type == op and name not in self.outputs
        return users[0] if ok else None

    def chain(self, mul):
        """(x, a, inv_b, nodes) when ``mul`` starts a SnakeBeta chain on a [..., C, T] input."""
        if mul.op_type != "Mul" or len(mul.input) != 2:
            return None
        a = next((i for i in mul.input if _coefficient(i, self.inits)), None)
        x = _other(mul, a) if a else None
        sin = self.only_user(mul.output[0], "Sin") if x else None
        sq = self.only_user(sin.output[0], "Mul") if sin else None
        if sq is None or list(sq.input) != [sin.output[0]] * 2:
            return None
        scale = self.only_user(sq.output[0], "Mul")
        inv_b = _other(scale, sq.output[0]) if scale else None
        add = self.only_user(scale.output[0], "Add") if inv_b else None
        c = _coefficient(a, self.inits)
        shape = self.shapes.get(x)
        if add is None or _other(add, scale.output[0]) != x or _coefficient(inv_b, self.inits) != c:
            return None
        if shape is None or len(shape) < 3 or shape[-2] != c:
            return None
        return x, a, inv_b, [mul, sin, sq, scale, add]


def _shapes(model) -> dict:
    """Static dims of every tensor the shape inference knows (None for a symbolic dim)."""
    onnx = require("onnx", "export", "ONNX export")
    inferred = onnx.shape_inference.infer_shapes(model).graph
    shapes = {}
    for info in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        t = info.type.tensor_type
        if t.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return shapes


def fuse_snake_model(model) -> int:
    """Rewrite ``model`` in place; returns how many chains became ``qtts.kernels::SnakeBeta`` nodes."""
    onnx = require("onnx", "export", "ONNX export")
    g = _Graph(model.graph, _shapes(model))
    found = [c for c in (g.chain(n) for n in model.graph.node) if c]
    if not found:
        return 0
    drop = {id(n) for _x, _a, _b, nodes in found for n in nodes}
    start = {id(nodes[0]): (x, a, b, nodes[-1].output[0]) for x, a, b, nodes in found}
    kept = []
    for node in model.graph.node:
        if id(node) in start:
            x, a, b, y = start[id(node)]
            kept.append(onnx.helper.make_node(OP, [x, a, b], [y], name=f"{node.name or y}/snake", domain=DOMAIN))
        elif id(node) not in drop:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    if not any(f.domain == DOMAIN and f.name == OP for f in model.functions):
        attach_function(onnx, model, snake_function())
    return len(found)


def attach_function(onnx, model, function) -> None:
    """Add the model-local ``function`` (ONNX IR 8) and its domain's opset to ``model``."""
    model.functions.append(function)
    if not any(o.domain == function.domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(function.domain, 1))
    model.ir_version = max(model.ir_version, 8)


def fuse_snake(path: str) -> int:
    """:func:`fuse_snake_model` on the file at ``path`` (rewritten via a temp name + rename)."""
    onnx = require("onnx", "export", "ONNX export")
    model = onnx.load(path)
    n = fuse_snake_model(model)
    if n:
        onnx.checker.check_model(model)
        tmp = temp_beside(path, ".onnx.tmp")
        try:
            onnx.save(model, tmp)
            publish(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    log.info("%s: %d SnakeBeta chains -> %s::%s", path, n, DOMAIN, OP)
    return n
