"""The Hadamard rotation of ``--repair rotate`` (qtts.export.rotate) is exact in fp32: the rotation is
orthogonal, the in-graph form equals the dense matrix, the rotated talker and predictor graphs compute
what the plain ones do (torch, both layouts, plain and planted weights), and an fp32 bundle exported with
it passes `qtts verify plan`'s fp32 gate (identical greedy codes). Its 4-bit effect:
tests/export/test_repair.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from qtts.cli import main as qtts_main


@pytest.mark.parametrize("n", [8, 48, 64, 96, 1024, 3072])
def test_rotation_is_orthogonal_and_the_graph_form_is_the_matrix(n):
    from qtts.export.rotate import HadamardRotation, factors

    m, a, b = factors(n)
    assert m * a * b == n and a <= b and (a * b) & (a * b - 1) == 0
    rot = HadamardRotation(n)
    q = rot.matrix()
    np.testing.assert_allclose((q @ q.T).numpy(), np.eye(n), atol=1e-12)
    x = torch.randn(2, 3, n)
    np.testing.assert_allclose(rot(x).double().numpy(), (x.double() @ q).numpy(), atol=1e-5)
    np.testing.assert_allclose(rot.inverse(x).double().numpy(), (x.double() @ q.T).numpy(), atol=1e-5)
    np.testing.assert_allclose(rot.inverse(rot(x)).numpy(), x.numpy(), atol=1e-5)
    assert torch.equal(HadamardRotation(n).signs, rot.signs)  # seeded: exports are deterministic


@pytest.mark.parametrize("n", [48, 1024, 3072])
def test_reads_and_writes_are_the_dense_products(n):
    """The factored weight transforms equal the dense ``Q^T diag(g) W`` and ``W Q`` (float64 products
    rounded to fp32: equal but for a rare last bit)."""
    from qtts.export.rotate import HadamardRotation, reads, writes

    rot, gen = HadamardRotation(n), torch.Generator().manual_seed(n)
    q = rot.matrix()
    w, gain, wt = torch.randn(n, 40, generator=gen), torch.rand(n, generator=gen) + 0.5, torch.randn(24, n, generator=gen)
    dense_reads = (q.T @ (gain.double()[:, None] * w.double())).float()
    dense_writes = (wt.double() @ q).float()
    for got, want in ((reads(w, rot, gain), dense_reads), (reads(w, rot), (q.T @ w.double()).float()),
                      (writes(wt, rot), dense_writes)):  # fmt: skip
        assert got.dtype == torch.float32 and got.shape == want.shape and got.is_contiguous()
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
        assert (got != want).float().mean() < 1e-3


def test_odd_sizes_are_refused():
    from qtts.export.rotate import factors

    with pytest.raises(ValueError, match="odd size 7"):
        factors(7)


def test_rotation_spreads_an_outlier_channel():
    """What it is for: a weight column scaled 50x (a planted norm gain) dominates every block's absmax
    before; after the rotation no entry stands out (block-128 4-bit weight SNR back near Gaussian)."""
    from qtts.export.quantize import fake_quant
    from qtts.export.rotate import HadamardRotation, reads

    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.standard_normal((1024, 256)).astype(np.float32))
    gain = torch.ones(1024)
    gain[::256] = 50.0

    def snr(m):
        m = m.numpy()
        return 10 * np.log10(np.sum(m**2) / np.sum((fake_quant(m, 4, 128) - m) ** 2))

    folded = gain[:, None] * w
    rotated = reads(w, HadamardRotation(1024), gain)
    assert snr(rotated) >= snr(folded) + 3.0, (snr(folded), snr(rotated))
    assert snr(rotated) >= 18.0


def _talker(snapshot):
    from qtts.weights import load_checkpoint

    return load_checkpoint(snapshot, components=("talker",)).model.talker.eval()


@pytest.fixture(scope="module", params=["0.6b", "1.7b", "planted"])
def talker(request, tiny_snapshot, tmp_path_factory):
    if request.param == "planted":
        from conftest import REAL_TOKENIZER_DIR
        from qtts.tools.random_checkpoint import write_random_checkpoint

        snap = write_random_checkpoint(str(tmp_path_factory.mktemp("rot") / "tiny"), size="tiny",
                                       kind="custom_voice", tokenizer_dir=REAL_TOKENIZER_DIR, planted=True)  # fmt: skip
    else:
        snap = tiny_snapshot("custom_voice", layout=request.param)
    return _talker(snap)


def _close(a, b, rtol=2e-5):
    assert float((a - b).abs().max()) <= rtol * float(a.abs().max()), float((a - b).abs().max() / a.abs().max())


def test_rotated_graphs_compute_the_plain_graphs(talker):
    from qtts.export.contrib import rope_tables
    from qtts.export.graphs import PredictorFrameGraph, TalkerGraph

    cfg, t = talker.cfg, 5
    cos, sin = rope_tables(16, cfg.head_dim, cfg.rope_theta)
    past = [torch.zeros(1, cfg.num_key_value_heads, 16, cfg.head_dim) for _ in range(2 * cfg.num_hidden_layers)]
    emb = torch.from_numpy(np.random.default_rng(1).standard_normal((1, t, cfg.hidden_size)).astype(np.float32))
    lengths = (torch.tensor([t - 1], dtype=torch.int32), torch.tensor(t, dtype=torch.int32))
    args = (emb * 0.05, *lengths, cos, sin, *past)
    with torch.no_grad():
        plain, rotated = TalkerGraph(talker)(*args), TalkerGraph(talker, rotate=True)(*args)
        for a, b in zip(plain, rotated):  # logits, hidden, every present key and value
            _close(a, b)
        frame = (plain[1], torch.tensor([3]), torch.rand(15), torch.ones(1), torch.tensor([50]), torch.ones(1),
                 torch.zeros(1, dtype=torch.bool))  # fmt: skip
        codes, logits = PredictorFrameGraph(talker)(*frame)
        rcodes, rlogits = PredictorFrameGraph(talker, rotate=True)(*frame)
    assert torch.equal(codes, rcodes)
    _close(logits, rlogits)
    assert TalkerGraph(talker, rotate=True).layers[0].input_layernorm.weight.eq(1).all()  # gains folded


def test_an_fp32_rotated_bundle_passes_the_fp32_gate(snapshot, tmp_path):
    from qtts.export.verify import verify_plan

    out = str(tmp_path / "rot")
    assert qtts_main(["export", "onnx", "-m", snapshot, "-o", out, "--weights", "fp32", "--repair", "rotate",
                      "--components", "talker", "predictor", "--chunk-frames", "0"]) == 0  # fmt: skip
    report = verify_plan(snapshot, os.path.join(out, "plan.json"), frames=12, threads=1)
    assert report["greedy_equal_rate"] == 1.0, report
    assert report["talker_logit_snr_db_min"] >= 80.0, report
    assert report["weights"]["recipe"]["repair"] == ["rotate"]
