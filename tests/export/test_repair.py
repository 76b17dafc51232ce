"""4-bit repairs on tiny checkpoints: the planted structure is there, the AWQ fold leaves fp32 unchanged,
and int4 with --repair awq,mse or --repair rotate recovers logit SNR on the planted checkpoint without
costing the plain one (the rotation's fp32 exactness: tests/export/test_rotate.py).
Random weights test the method, not the real model; `qtts verify plan` on real weights is the real check."""

from __future__ import annotations

import os

import numpy as np
import pytest

from qtts.cli import main as qtts_main

FRAMES = 24


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from conftest import REAL_TOKENIZER_DIR
    from qtts.tools.random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(str(tmp_path_factory.mktemp("planted") / "tiny"), size="tiny", kind="custom_voice",
                                   tokenizer_dir=REAL_TOKENIZER_DIR, planted=True)  # fmt: skip


def _talker(snapshot):
    from qtts.weights import load_checkpoint

    return load_checkpoint(snapshot, components=("talker",)).model.talker.eval()


def test_planted_structure_is_planted(planted, snapshot):
    from qtts.tools.planted_weights import outliers

    t, plain = _talker(planted), _talker(snapshot)
    idx, gains = outliers(t.cfg.hidden_size, 1)
    norm = t.model.layers[1].input_layernorm.weight.detach()
    ref = plain.model.layers[1].input_layernorm.weight.detach()
    assert len(idx) == 1 and 10 <= float(gains[0]) <= 100
    np.testing.assert_allclose(norm[idx].numpy(), (ref[idx] * gains).numpy(), rtol=1e-5)
    others = np.setdiff1d(np.arange(len(norm)), idx.numpy())
    np.testing.assert_array_equal(norm[others].numpy(), ref[others].numpy())

    def kurtosis(w):
        w = w.detach().double().flatten()
        return float(((w - w.mean()) ** 4).mean() / w.var() ** 2 - 3)

    q, q0 = t.model.layers[0].mlp.down_proj.weight, plain.model.layers[0].mlp.down_proj.weight
    assert kurtosis(q) > 2.0 and abs(kurtosis(q0)) < 0.5  # Student-t(4) vs Gaussian
    assert abs(float(q.std()) / float(q0.std()) - 1) < 0.15  # same std


def _outputs(talker, seed: int = 0):
    import torch

    emb = torch.from_numpy(np.random.default_rng(seed).standard_normal((1, 7, talker.cfg.hidden_size)).astype(np.float32))
    with torch.no_grad():
        logits, _h, _c = talker(emb * 0.05, 0, talker.new_cache(16))
        p = talker.code_predictor
        h, _ = p(emb[:, :2] * 0.05, 0, p.new_cache(17))
        heads = torch.stack([p.head(j, h[:, -1]) for j in range(15)])
    return logits.numpy(), heads.numpy()


def test_awq_fold_leaves_the_fp32_model_unchanged(planted):
    from qtts.export.awq import apply_awq
    from qtts.export.recipe import for_talker

    t = _talker(planted)
    before = _outputs(t)
    info = apply_awq(t, planted, for_talker(t, "int4", "int4", None, "awq"), 128)
    scaled = [k for k, v in info["groups"].items() if v["alpha"] > 0]
    assert len(scaled) >= 8, info["groups"]  # the outlier channels make most groups take scales
    assert all(v["error_ratio"] <= 1.0 for v in info["groups"].values())
    for a, b in zip(before, _outputs(t)):
        assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(a))


def _export_verify(snapshot, out, repair: str) -> dict:
    from qtts.export.verify import verify_plan

    assert qtts_main(["export", "onnx", "-m", snapshot, "-o", out, "--weights", "int4", "--repair", repair,
                      "--components", "talker", "predictor", "--no-batch-graphs", "--chunk-frames", "0"]) == 0  # fmt: skip
    return verify_plan(snapshot, os.path.join(out, "plan.json"), frames=FRAMES, threads=1)


@pytest.fixture(scope="module")
def reports(planted, snapshot, tmp_path_factory):
    root = tmp_path_factory.mktemp("repair")
    return {(name, repair): _export_verify(snap, str(root / f"{name}-{repair}"), repair)
            for name, snap in (("planted", planted), ("plain", snapshot)) for repair in ("none", "awq,mse", "rotate")}  # fmt: skip


def _median(report, part):
    return report[f"{part}_logit_snr_db_median"]


def test_repair_recovers_snr_on_the_planted_checkpoint(reports):
    plain, fixed = reports[("planted", "none")], reports[("planted", "awq,mse")]
    assert _median(fixed, "talker") >= _median(plain, "talker") + 2.0, (plain, fixed)
    # the tiny predictor (32 wide: its one outlier channel with a 10-100x gain swamps every block) stays
    # within noise here (1.8 -> 1.1 dB median in one run); at mid size awq lifts it 6.5 -> 10.2 dB and
    # awq,mse to 8.0 dB (docs/fidelity.md), which a CI-sized test cannot afford
    assert _median(fixed, "predictor") >= _median(plain, "predictor") - 1.5, (plain, fixed)
    assert fixed["weights"]["recipe"]["repair"] == ["awq", "mse"]


def test_rotation_recovers_snr_on_the_planted_checkpoint(reports):
    """One run: talker median 11.0 -> 14.2 dB, predictor 1.8 -> 7.2 dB (the plain checkpoint: 19.1 / 14.8)."""
    plain, fixed = reports[("planted", "none")], reports[("planted", "rotate")]
    assert _median(fixed, "talker") >= _median(plain, "talker") + 2.0, (plain, fixed)
    assert _median(fixed, "predictor") >= _median(plain, "predictor") + 3.0, (plain, fixed)
    assert fixed["weights"]["recipe"]["repair"] == ["rotate"]


@pytest.mark.parametrize("repair", ["awq,mse", "rotate"])
def test_repair_costs_nothing_on_the_plain_checkpoint(reports, repair):
    plain, fixed = reports[("plain", "none")], reports[("plain", repair)]
    for part in ("talker", "predictor"):
        assert _median(fixed, part) >= _median(plain, part) - 1.0, (part, plain, fixed)
