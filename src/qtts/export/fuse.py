"""Decoder layers of a quantized predictor frame graph -> one ``qtts.kernels::DecoderLayer`` node each.

The frame graph runs 5 layers x 15 passes; each layer is ~27 onnxruntime nodes, four of them int8
GEMVs (``MatMulNBits``) and one ``GroupQueryAttention``, and every one of those five hands its work
to the intra-op thread pool, ~390 hand-offs a frame (docs/performance.md, "Compiled kernels": the
op is opt-in, ``qtts export onnx --predictor-kernels``). :func:`fuse_layers_model`
replaces each layer by one node that calls the model-local function ``qtts.kernels::DecoderLayer``
(ONNX IR 8 functions) whose body is the layer's own nodes, as :mod:`qtts.export.snake` does for
SnakeBeta. So the bundle stays portable:

* where the compiled kernel library (:mod:`qtts.kernels`, ``layer.c``) is registered with the session,
  onnxruntime runs the whole layer in one call whose two threads stay busy through it;
* everywhere else onnxruntime inlines the function body: the plain layer's nodes, and the frame's
  codes and logits bit for bit (tests/export/test_fuse_layers.py).

Only the layout the kernel implements is rewritten: 8-bit ``MatMulNBits`` with blocks of 128 and int8
activations (``accuracy_level`` 4), the MLP's Hadamard rotation (``--repair rotate``), batch 1. Any
other graph (int4, unrotated, the batch graphs, the talker) is left as it is.
"""

from __future__ import annotations

import logging

from ..errors import require
from .snake import attach_function

log = logging.getLogger(__name__)

DOMAIN, OP = "qtts.kernels", "DecoderLayer"
#: the function's formal inputs, in the op's order (src/qtts/kernels/layer.c)
INPUTS = ("x", "past_k", "past_v", "seqlens_k", "total_len", "cos", "sin", "input_norm", "qkv_q", "qkv_s",
          "q_norm", "k_norm", "o_q", "o_s", "post_norm", "gu_q", "gu_s", "ha", "hb", "down_q", "down_s")  # fmt: skip
OUTPUTS = ("y", "present_k", "present_v")
_NBITS = {"bits": 8, "block_size": 128, "accuracy_level": 4}


class _Index:
    """Producers and users of every tensor of a graph."""

    def __init__(self, graph):
        self.inits = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.producer = {o: n for n in graph.node for o in n.output}
        self.users: dict[str, list] = {}
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.users.setdefault(name, []).append(node)

    def make(self, name: str, op: str):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op else None

    def only(self, name: str, op: str):
        users = self.users.get(name, [])
        ok = len(users) == 1 and users[0].op_type == op and name not in self.outputs
        return users[0] if ok else None


def _attrs(node) -> dict:
    return {a.name: a.i for a in node.attribute if a.type == a.INT}


def _int8_gemv(ix: _Index, name: str):
    """The MatMulNBits node making ``name`` when it has the kernel's layout, else None."""
    node = ix.make(name, "MatMulNBits")
    ok = node is not None and len(node.input) == 3 and all(_attrs(node).get(k) == v for k, v in _NBITS.items())
    return node if ok else None


def _head_input(ix: _Index, name: str):
    """``Reshape(SLN(Reshape(Slice(qkv))))`` -> (the norm's weight, the Slice's data) or None."""
    outer = ix.make(name, "Reshape")
    norm = ix.make(outer.input[0], "SimplifiedLayerNormalization") if outer is not None else None
    inner = ix.make(norm.input[0], "Reshape") if norm is not None else None
    part = ix.make(inner.input[0], "Slice") if inner is not None else None
    return (norm.input[1], part.input[0]) if part is not None else None


def _other(node, name: str) -> str | None:
    ins = list(node.input)
    return ins[1 - ins.index(name)] if node is not None and len(ins) == 2 and name in ins else None


def _attention_half(ix: _Index, gqa) -> dict | None:
    """The boundary tensors of a layer up to its attention's residual Add."""
    q, k = _head_input(ix, gqa.input[0]) or (None, None), _head_input(ix, gqa.input[1]) or (None, None)
    v = ix.make(gqa.input[2], "Slice")
    if None in q or None in k or v is None or not q[1] == k[1] == v.input[0]:
        return None
    qkv = _int8_gemv(ix, q[1])
    norm = ix.make(qkv.input[0], "SimplifiedLayerNormalization") if qkv is not None else None
    o = ix.only(gqa.output[0], "MatMulNBits")
    if norm is None or o is None or _int8_gemv(ix, o.output[0]) is None:
        return None
    x = norm.input[0]
    add = ix.only(o.output[0], "Add")
    if add is None or _other(add, o.output[0]) != x:
        return None
    return {"x": x, "past_k": gqa.input[3], "past_v": gqa.input[4], "seqlens_k": gqa.input[5],
            "total_len": gqa.input[6], "cos": gqa.input[7], "sin": gqa.input[8], "input_norm": norm.input[1],
            "qkv_q": qkv.input[1], "qkv_s": qkv.input[2], "q_norm": q[0], "k_norm": k[0], "o_q": o.input[1],
            "o_s": o.input[2], "x2": add.output[0]}  # fmt: skip


def _mlp_half(ix: _Index, x2: str) -> dict | None:
    """The boundary tensors of a layer's MLP: ``x2`` -> norm, gate/up, rotation, down, residual Add."""
    users = ix.users.get(x2, [])
    post = next((u for u in users if u.op_type == "SimplifiedLayerNormalization"), None)
    mm = ix.only(post.output[0], "MatMulNBits") if post is not None else None
    gu = _int8_gemv(ix, mm.output[0]) if mm is not None else None
    adds = [u for u in users if u.op_type == "Add"]
    if gu is None or len(users) != 2 or len(adds) != 1:
        return None
    down = ix.make(_other(adds[0], x2) or "", "MatMulNBits")
    if down is None or _int8_gemv(ix, down.output[0]) is None:
        return None
    shaped = ix.make(down.input[0], "Reshape")
    right = ix.make(shaped.input[0], "MatMul") if shaped is not None else None
    left = ix.make(right.input[0], "MatMul") if right is not None else None
    if left is None or not ("rotation" in left.input[0] and "rotation" in right.input[1]):
        return None  # the kernel implements the rotated MLP only
    return {"post_norm": post.input[1], "gu_q": gu.input[1], "gu_s": gu.input[2], "ha": left.input[0],
            "hb": right.input[1], "down_q": down.input[1], "down_s": down.input[2], "y": adds[0].output[0]}  # fmt: skip


def match_layer(ix: _Index, gqa) -> dict | None:
    """Formal name -> graph tensor for the layer around ``gqa`` (inputs and outputs), or None."""
    att = _attention_half(ix, gqa)
    mlp = _mlp_half(ix, att["x2"]) if att is not None else None
    if mlp is None:
        return None
    del att["x2"]
    return {**att, **mlp, "present_k": gqa.output[1], "present_v": gqa.output[2]}


#: GroupQueryAttention's inputs 3..8 are formal inputs by position (the first pass reads one empty
#: constant as both past key and past value)
_GQA_FORMALS = {3: "past_k", 4: "past_v", 5: "seqlens_k", 6: "total_len", 7: "cos", 8: "sin"}


def _region(ix: _Index, match: dict) -> list | None:
    """The layer's nodes (graph order kept by the caller): everything the outputs need back to the
    formal inputs; None when a tensor inside is also read outside (the layer is not self-contained)."""
    stop = {match[k] for k in INPUTS}
    nodes, seen, todo = {}, set(), [match[k] for k in OUTPUTS]
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        node = ix.producer.get(name)
        if node is None:
            return None  # an initializer or graph input that is not a formal input
        if id(node) not in nodes:
            nodes[id(node)] = node
            todo.extend(i for i in node.input if i)
    outputs = {match[k] for k in OUTPUTS}
    for node in nodes.values():
        if node.op_type == "Constant":
            continue  # copied into the body; the graph keeps its own if others read it
        for out in node.output:
            outside = [u for u in ix.users.get(out, []) if id(u) not in nodes]
            if out not in outputs and (outside or out in ix.outputs):
                return None
    return list(nodes.values())


#: the plain layer the kernel computes, by op (Constants aside): 4 RMSNorms (input, q, k, post), the
#: four GEMVs, q/k/v and gate/up Slices, the per-head Reshapes and the rotation's, SiLU * up, the
#: rotation's two MatMuls, two residual Adds
LAYER_OPS = {"SimplifiedLayerNormalization": 4, "MatMulNBits": 4, "Slice": 5, "Reshape": 6, "GroupQueryAttention": 1,
             "Add": 2, "Sigmoid": 1, "Mul": 2, "MatMul": 2}  # fmt: skip
EPS = 1e-6  # the kernel's RMSNorm epsilon (every Qwen3-TTS predictor's rms_norm_eps)


def kernel_layout(nodes: list) -> str:
    """'' when ``nodes`` are the layer the kernel computes, else what differs."""
    ops: dict[str, int] = {}
    for node in nodes:
        if node.op_type != "Constant":
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    if ops != LAYER_OPS:
        return f"ops {ops}"
    for node in nodes:
        floats = {a.name: a.f for a in node.attribute if a.type == a.FLOAT}
        if node.op_type == "SimplifiedLayerNormalization" and abs(floats.get("epsilon", 0.0) - EPS) > 1e-12:
            return f"RMSNorm epsilon {floats.get('epsilon')}"
        if node.op_type == "GroupQueryAttention" and (_attrs(node).get("do_rotary"), _attrs(node).get(
                "rotary_interleaved", 0)) != (1, 0):  # fmt: skip
            return "attention without rotate-half RoPE inside"
    return _kernel_dims(nodes)


#: the kernel's limit on a GEMV's input width (src/qtts/kernels/layer.h, LAYER_MAX_BLOCKS x 128)
MAX_K = 131072


def _kernel_dims(nodes: list) -> str:
    """'' when the layer's widths fit the kernel (layer_op.c): every GEMV's input width (hidden,
    heads x head dim, intermediate) a multiple of 128, the head dim even, the query heads a
    multiple of the kv heads."""
    gqa = next(n for n in nodes if n.op_type == "GroupQueryAttention")
    heads, kvh = _attrs(gqa).get("num_heads", 0), _attrs(gqa).get("kv_num_heads", 0)
    gemvs = [n for n in nodes if n.op_type == "MatMulNBits"]
    slices = [n.input[0] for n in nodes if n.op_type == "Slice"]
    qkv = [_attrs(n)["N"] for n in gemvs if slices.count(n.output[0]) == 3]  # q, k, v (gate/up: 2)
    widths = sorted(_attrs(n)["K"] for n in gemvs)
    head_dim = qkv[0] // (heads + 2 * kvh) if len(qkv) == 1 and kvh and heads % kvh == 0 else 0
    if head_dim % 2 or not head_dim or any(k % 128 or k > MAX_K for k in widths):
        return f"head dim {head_dim}, GEMV input widths {widths}: the kernel needs multiples of 128"
    return ""


def _body(onnx, nodes: list, match: dict) -> list:
    """The region's nodes renamed canonically: formal names for the boundary, ``t<i>`` inside."""
    formal = {match[k]: k for k in INPUTS + OUTPUTS}
    inner: dict[str, str] = {}

    def rename(name: str) -> str:
        if not name or name in formal:
            return formal.get(name, name)
        return inner.setdefault(name, f"t{len(inner)}")

    body = []
    for i, node in enumerate(nodes):
        ins = [(_GQA_FORMALS[j] if node.op_type == "GroupQueryAttention" and j in _GQA_FORMALS else rename(n))
               for j, n in enumerate(node.input)]  # fmt: skip
        copy = onnx.helper.make_node(node.op_type, ins, [rename(o) for o in node.output], name=f"n{i}",
                                     domain=node.domain)  # fmt: skip
        copy.attribute.extend(node.attribute)
        body.append(copy)
    return body


def layer_function(onnx, body: list):
    """The FunctionProto ``qtts.kernels::DecoderLayer``: the plain layer's nodes."""
    opsets = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.microsoft", 1)]
    return onnx.helper.make_function(DOMAIN, OP, list(INPUTS), list(OUTPUTS), body, opsets)


def _toposort(nodes: list) -> list:
    """``nodes`` in an order where every input is made before it is read (the original order where
    it already is)."""
    made = {o for n in nodes for o in n.output}
    done, out, pending = set(), [], list(nodes)
    while pending:
        rest = []
        for node in pending:
            if all(i in done or i not in made for i in node.input):
                out.append(node)
                done.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise ValueError("the fused graph has a cycle")
        pending = rest
    return out


def fuse_layers_model(model) -> int:
    """Rewrite ``model`` in place; returns how many layers became ``qtts.kernels::DecoderLayer``
    nodes (0, and the graph untouched, unless every attention's layer has the kernel's layout)."""
    onnx = require("onnx", "export", "ONNX export")
    ix = _Index(model.graph)
    layers = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    found = []
    for gqa in layers:
        match = match_layer(ix, gqa)
        region = _region(ix, match) if match is not None else None
        why = "no decoder layer around it" if region is None else kernel_layout(region)
        if why:
            log.info("%s: %s; the graph keeps its plain layers", gqa.name, why)
            return 0
        order = {id(n): i for i, n in enumerate(model.graph.node)}
        found.append((match, sorted(region, key=lambda n: order[id(n)])))
    if not found:
        return 0
    bodies = [_body(onnx, region, match) for match, region in found]
    if any(b != bodies[0] for b in bodies[1:]):
        log.info("the layers differ (shapes or constants); the graph keeps its plain layers")
        return 0
    drop = {id(n) for _m, region in found for n in region if n.op_type != "Constant"}
    nodes = [n for n in model.graph.node if id(n) not in drop]
    for i, (match, _region_nodes) in enumerate(found):
        nodes.append(onnx.helper.make_node(OP, [match[k] for k in INPUTS], [match[k] for k in OUTPUTS],
                                           name=f"/layer_op_{i}", domain=DOMAIN))  # fmt: skip
    used = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
    nodes = [n for n in nodes if n.op_type != "Constant" or any(o in used for o in n.output)]
    del model.graph.node[:]
    model.graph.node.extend(_toposort(nodes))
    attach_function(onnx, model, layer_function(onnx, bodies[0]))
    return len(found)


def fuse_layers(path: str) -> int:
    """:func:`fuse_layers_model` on the graph at ``path`` (weights loaded and written back beside it)."""
    onnx = require("onnx", "export", "ONNX export")
    from .write import save_model

    model = onnx.load(path)
    n = fuse_layers_model(model)
    if n:
        save_model(model, path)
    log.info("%s: %d decoder layers -> %s::%s", path, n, DOMAIN, OP)
    return n
