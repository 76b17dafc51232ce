"""ONNX graph rewrites of the exported vocoder step (prototypes; no qtts source is changed).

* :func:`conv1d_to_2d`: every 1-D Conv / ConvTranspose becomes Unsqueeze -> 2-D conv over
  ``[N, C, 1, T]`` with a ``[.., 1, k]`` kernel -> Squeeze, so that onnxruntime's NCHWc
  transformer (ORT_ENABLE_ALL, 2-D convs only) and its direct NCHWc conv kernels apply.
* :func:`snake_to_custom`: the SnakeBeta node chain ``x + inv_b * sin(x*a)^2`` (Mul, Sin, Mul,
  Mul, Add as exported) becomes one ``qtts.perf::SnakeBeta(x, a, inv_b)`` node (custom op
  library, see snake_op.cc).
* :func:`split_sin`: every Sin splits along channels into ``parts`` Sin nodes (for ORT's
  parallel executor, which runs independent nodes on the inter-op pool).
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _const(graph, name: str, values) -> str:
    import numpy as np

    graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
    return name


def conv1d_to_2d(model: onnx.ModelProto, skip_out_channels_below: int = 0) -> int:
    """Rewrite 1-D convs as 2-D (see module doc); returns the number of rewritten nodes."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    axes = _const(g, "__axes2", [2])
    new_nodes, count = [], 0
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1 else None
        if w is None or len(w.dims) != 3:
            new_nodes.append(n)
            continue
        out_ch = w.dims[0] if n.op_type == "Conv" else w.dims[1]
        if out_ch < skip_out_channels_below:
            new_nodes.append(n)
            continue
        arr = numpy_helper.to_array(w)
        w.CopyFrom(numpy_helper.from_array(arr[:, :, None, :], w.name))
        a = _attrs(n)
        k = a.get("kernel_shape", [arr.shape[-1]])
        attrs = {"kernel_shape": [1, k[0]], "dilations": [1, a.get("dilations", [1])[0]],
                 "strides": [1, a.get("strides", [1])[0]], "group": a.get("group", 1)}
        p = a.get("pads", [0, 0])
        attrs["pads"] = [0, p[0], 0, p[1]]
        if "output_padding" in a:
            attrs["output_padding"] = [0, a["output_padding"][0]]
        x4, y4 = n.input[0] + f"__4d{count}", n.output[0] + "__4d"
        new_nodes.append(helper.make_node("Unsqueeze", [n.input[0], axes], [x4]))
        new_nodes.append(helper.make_node(n.op_type, [x4, *n.input[1:]], [y4], name=(n.name or "") + "_2d", **attrs))
        new_nodes.append(helper.make_node("Squeeze", [y4, axes], [n.output[0]]))
        count += 1
    del g.node[:]
    g.node.extend(new_nodes)
    return count


def _consumers(graph) -> dict:
    out: dict = {}
    for n in graph.node:
        for i in dict.fromkeys(n.input):  # a node that reads a value twice counts once
            out.setdefault(i, []).append(n)
    return out


def find_snakes(model: onnx.ModelProto) -> list:
    """[(x, a_name, inv_b_name, [nodes], out_name)] for every Mul->Sin->Mul(s,s)->Mul(inv_b)->Add(x) chain."""
    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    cons = _consumers(g)
    inits = {i.name for i in g.initializer}
    found = []
    for sin in (n for n in g.node if n.op_type == "Sin"):
        mul_a = producers.get(sin.input[0])
        if mul_a is None or mul_a.op_type != "Mul":
            continue
        x, a = (mul_a.input if mul_a.input[1] in inits else mul_a.input[::-1])
        if a not in inits:
            continue
        sq = [c for c in cons.get(sin.output[0], []) if c.op_type == "Mul" and c.input[0] == c.input[1]]
        if len(sq) != 1:
            continue
        scale = cons.get(sq[0].output[0], [])
        if len(scale) != 1 or scale[0].op_type != "Mul":
            continue
        inv_b = [i for i in scale[0].input if i != sq[0].output[0]][0]
        add = cons.get(scale[0].output[0], [])
        if len(add) != 1 or add[0].op_type != "Add" or x not in add[0].input:
            continue
        found.append((x, a, inv_b, [mul_a, sin, sq[0], scale[0], add[0]], add[0].output[0]))
    return found


def snake_to_custom(model: onnx.ModelProto, domain: str = "qtts.perf") -> int:
    """Replace every SnakeBeta chain with one custom node; returns the count."""
    g = model.graph
    snakes = find_snakes(model)
    drop = {id(n) for s in snakes for n in s[3]}
    first = {id(s[3][0]): s for s in snakes}
    new_nodes = []
    for n in g.node:
        if id(n) in first:
            x, a, inv_b, _, out = first[id(n)]
            new_nodes.append(helper.make_node("SnakeBeta", [x, a, inv_b], [out], domain=domain))
        elif id(n) not in drop:
            new_nodes.append(n)
    del g.node[:]
    g.node.extend(new_nodes)
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return len(snakes)


def snake_cos(model: onnx.ModelProto) -> int:
    """x + inv_b*sin(ax)^2 -> (x + c) - c*cos(2a x), c = inv_b/2 (constants folded): Mul, Cos, Mul, Add, Sub."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    snakes = find_snakes(model)
    drop = {id(n) for s in snakes for n in s[3]}
    first = {id(s[3][0]): s for s in snakes}
    new_nodes = []
    for n in g.node:
        if id(n) in first:
            x, a, inv_b, _, out = first[id(n)]
            a2 = numpy_helper.to_array(inits[a]) * 2.0
            c = numpy_helper.to_array(inits[inv_b]) * 0.5
            g.initializer.append(numpy_helper.from_array(a2.astype("float32"), a + "__x2"))
            g.initializer.append(numpy_helper.from_array(c.astype("float32"), inv_b + "__half"))
            t = out + "__cos"
            new_nodes += [
                helper.make_node("Mul", [x, a + "__x2"], [t + "0"]),
                helper.make_node("Cos", [t + "0"], [t + "1"]),
                helper.make_node("Mul", [t + "1", inv_b + "__half"], [t + "2"]),
                helper.make_node("Add", [x, inv_b + "__half"], [t + "3"]),
                helper.make_node("Sub", [t + "3", t + "2"], [out]),
            ]
        elif id(n) not in drop:
            new_nodes.append(n)
    del g.node[:]
    g.node.extend(new_nodes)
    return len(snakes)
