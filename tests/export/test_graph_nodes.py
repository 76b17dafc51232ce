"""The rewritten generation graphs (issue 24, "fewer nodes"): what onnxruntime executes per predictor
frame and talker step, and that the rewrites compute what the torch reference computes.

The rewrites: q/k head reshapes with a constant ``[0, -1, ...]`` shape (no Shape/Gather/Unsqueeze/
Concat chain in the exported proto), the frame graph's per-pass positions as constants, one
uniforms Cast per frame, the ``[1, 1, ...]`` rank kept from a pass's head through its sampler to
the next pass's embedding row, and caches that grow from empty instead of 17 zero slots. On the
mid checkpoint's int8 bundle the frame went from 766 to 670 executed nodes with bitwise-identical
codes and logits. Counts are taken after onnxruntime's optimizer with the product's session
options (what runs), on the tiny checkpoint's fp32 graphs.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import pytest

from qtts.config import PREDICTOR_STEPS

#: the tiny bundle of the generation graphs only (no vocoder, no batch graphs)
FLAGS = ("--components", "talker", "predictor", "--no-batch-graphs", "--vocoder-main", "0")


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    return tiny_bundle("custom_voice", *FLAGS)


def _plan(bundle: str) -> dict:
    with open(os.path.join(bundle, "plan.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _layers(bundle: str, name: str) -> int:
    with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as fh:
        return int(json.load(fh)["graphs"][name]["layers"])


def _optimized_counts(path: str, tmp_path) -> collections.Counter:
    """Op types of the graph onnxruntime runs (ORT_ENABLE_ALL, the backend's session options)."""
    import onnx
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    so = session_options(1)
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "64")
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    model = onnx.load(so.optimized_model_filepath, load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node)


#: ops that compute shapes at run time: none may survive the rewrites in the generation graphs
SHAPE_OPS = ("Shape", "Unsqueeze", "Concat", "Expand", "ConstantOfShape")


def test_frame_graph_executes_few_nodes(bundle, tmp_path):
    """Ratchet: per predictor pass, 19 nodes per decoder layer (4 norms, 2 residual Adds, 4 MatMul,
    GQA, 2 Split, 4 Reshape, SiLU, Mul) and 25 for the pass's final norm, head, sampler and next
    embedding row; 10 for the frame's entry and outputs. Before the rewrites a frame ran 96 more
    (per pass: the position arithmetic Shape/Gather/Add/Cast, a uniform's Cast, a Gather and an
    Unsqueeze between passes)."""
    path = os.path.join(bundle, _plan(bundle)["predictor"]["artifacts"]["main"])
    layers = _layers(bundle, "predictor")
    counts = _optimized_counts(path, tmp_path)
    assert counts["SimplifiedLayerNormalization"] == (4 * layers + 1) * PREDICTOR_STEPS
    assert counts["Add"] == 2 * layers * PREDICTOR_STEPS  # the residual Adds only
    assert counts["GroupQueryAttention"] == layers * PREDICTOR_STEPS
    assert counts["Shape"] == 0 and counts["Concat"] <= 3 and counts["Unsqueeze"] <= 2  # the frame's entry only
    assert sum(counts.values()) <= PREDICTOR_STEPS * (19 * layers + 25) + 10, counts


def test_talker_graph_executes_few_nodes(bundle, tmp_path):
    path = os.path.join(bundle, _plan(bundle)["talker"]["artifacts"]["main"])
    layers = _layers(bundle, "talker")
    counts = _optimized_counts(path, tmp_path)
    assert counts["Add"] == 2 * layers
    assert not any(counts[op] for op in SHAPE_OPS), counts
    assert sum(counts.values()) <= 19 * layers + 3, counts  # + the last position's Gather, final norm, codec head


def test_exported_graphs_compute_no_shapes(bundle):
    """On the exported proto too (before onnxruntime folds anything): no shape arithmetic."""
    import onnx

    for name in ("talker", "predictor"):
        graph = onnx.load(os.path.join(bundle, _plan(bundle)[name]["artifacts"]["main"]), load_external_data=False).graph
        counts = collections.Counter(n.op_type for n in graph.node)
        assert counts["Shape"] == 0 and counts["Concat"] <= 3 and counts["Unsqueeze"] <= 2, (name, counts)


def _backends(snapshot: str, bundle: str):
    from qtts.backends import open as open_components
    from qtts.backends.torch import TorchBackend
    from qtts.weights import load_checkpoint

    ckpt = load_checkpoint(snapshot, components=("talker",))
    return TorchBackend(ckpt.model.talker), open_components(snapshot, os.path.join(bundle, "plan.json")).backend


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """ONNX fp32 against torch: equal up to float rounding (other kernels, other summation order)."""
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= 1e-4 * scale, (float(np.abs(got - want).max()), scale)


def test_rewritten_graphs_match_torch(snapshot, bundle):
    """Talker prefill + steps and a teacher-forced predictor frame: logits and hidden states of the
    fp32 ONNX graphs against the torch reference, codes identical."""
    from qtts.engine.generate import PredictorSampler
    from qtts.options import SamplingParams

    ref, test = _backends(snapshot, bundle)
    rng = np.random.default_rng(7)
    h = test.hidden_size
    s_ref, s_test = ref.new_state(64), test.new_state(64)
    embeds = [rng.standard_normal((5, h)).astype(np.float32)] + [rng.standard_normal((1, h)).astype(np.float32)
                                                                  for _ in range(4)]  # fmt: skip
    pos = 0
    for x in embeds:  # a 5-row prefill, then 4 steps
        l_ref, h_ref, s_ref = ref.talker(x, pos, s_ref)
        l_test, h_test, s_test = test.talker(x, pos, s_test)
        _close(np.asarray(l_test), np.asarray(l_ref))
        _close(np.asarray(h_test), np.asarray(h_ref))
        pos += len(x)
    greedy = PredictorSampler(SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0))
    u = rng.random(PREDICTOR_STEPS)
    for seed in range(3):
        hidden = np.random.default_rng(seed).standard_normal(h).astype(np.float32)
        (c_ref, l_ref), (c_test, l_test) = (b.predictor_logits(hidden, 17 + seed, greedy, u) for b in (ref, test))
        np.testing.assert_array_equal(np.asarray(c_test), np.asarray(c_ref))
        _close(np.asarray(l_test), np.asarray(l_ref))
