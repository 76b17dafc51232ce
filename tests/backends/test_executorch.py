"""ExecuTorch plans: a tiny fp32 bundle exported and spoken in .venv-et, greedy codes equal to torch fp32.

The main .venv has no executorch (its ~1.5 GB environment stays separate): the export and the
``qtts say --plan`` run drive ``.venv-et/bin/python`` in a subprocess. scripts/test.sh creates
``.venv-et`` (scripts/setup_executorch_env.sh); the fixture runs the same idempotent script, so the
file also passes on its own. Random weights test the mechanism, not the real model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from qtts.cli import main
from qtts.config import ModelConfig
from qtts.plans.plan import fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = "Hello there, this is a test of the phone runtime."
MAX_LEN = 128


def run_et(python: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([python, "-m", "qtts", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3600)  # fmt: skip


@pytest.fixture(scope="module")
def et_python() -> str:
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup_executorch_env.sh")], cwd=ROOT, check=True)
    return os.path.join(ROOT, ".venv-et", "bin", "python")


@pytest.fixture(scope="module")
def bundle(et_python, tiny_snapshot, tmp_path_factory):
    snap = tiny_snapshot("custom_voice")
    out = str(tmp_path_factory.mktemp("et") / "bundle")
    r = run_et(et_python, "export", "executorch", "-m", snap, "-o", out, "--max-len", str(MAX_LEN))
    assert r.returncode == 0, r.stderr[-4000:]
    return snap, out


def _say(args: list, tmp_path, name: str) -> np.ndarray:
    codes = str(tmp_path / f"{name}.npy")
    return codes, ["say", *args, "--greedy", "--max-frames", "20", "-o", str(tmp_path / f"{name}.wav"),
                   "--codes-out", codes, TEXT]  # fmt: skip


def test_say_plan_greedy_codes_equal_torch_fp32(bundle, et_python, tmp_path):
    snap, out = bundle
    speaker = ["--speaker", ModelConfig.from_dir(snap).speakers[0]]
    et_codes, argv = _say(["-m", snap, "--plan", os.path.join(out, "plan.json"), *speaker], tmp_path, "et")
    r = run_et(et_python, *argv)
    assert r.returncode == 0, r.stderr[-4000:]
    ref_codes, argv = _say(["-m", snap, "--plan", "torch", *speaker, "--threads", "1"], tmp_path, "torch")
    assert main(argv) == 0
    got, want = np.load(et_codes), np.load(ref_codes)
    assert got.shape == want.shape == (20, 16)
    np.testing.assert_array_equal(got, want)
    import soundfile as sf

    audio, sr = sf.read(str(tmp_path / "et.wav"))
    assert sr == 24000 and len(audio) == 20 * 1920 and np.abs(audio).max() > 0


def test_bundle_manifest_plan_and_contracts(bundle):
    snap, out = bundle
    with open(os.path.join(out, "plan.json")) as fh:
        plan = json.load(fh)
    with open(os.path.join(out, "manifest.json")) as fh:
        manifest = json.load(fh)
    assert {plan[c]["impl"] for c in ("talker", "predictor", "vocoder")} == {"executorch"}
    assert manifest["source"]["fingerprint"] == fingerprint(snap)
    assert manifest["precision"] == {"talker": "fp32", "predictor": "fp32", "vocoder": "fp32"}
    cfg = ModelConfig.from_dir(snap)
    t, p = cfg.talker, cfg.talker.code_predictor_config
    assert manifest["graphs"]["talker"]["kv"] == [t.num_hidden_layers, 2, t.num_key_value_heads, MAX_LEN, t.head_dim]
    assert manifest["graphs"]["predictor"]["kv"] == [p.num_hidden_layers, 2, p.num_key_value_heads, 17, p.head_dim]
    with open(os.path.join(out, "vocoder.b4.json")) as fh:
        assert json.load(fh)["codes_length"] == 4
    for name in [plan[c]["artifacts"]["main"] for c in ("talker", "predictor", "vocoder")]:
        with open(os.path.join(out, name), "rb") as fh:
            assert fh.read(8)[4:8] == b"ET12"  # the ExecuTorch program flatbuffer identifier
    assert not [n for n in os.listdir(os.path.dirname(out)) if n.startswith(".qtts-")]  # no temp left


def test_main_env_names_the_executorch_extra(bundle, tmp_path, capsys):
    """The main .venv has no executorch: loading the plan fails with the install hint (exit 2)."""
    snap, out = bundle
    assert "executorch" not in sys.modules
    speaker = ModelConfig.from_dir(snap).speakers[0]
    _, argv = _say(["-m", snap, "--plan", os.path.join(out, "plan.json"), "--speaker", speaker], tmp_path, "x")
    assert main(argv) == 2
    assert '".[executorch]"' in capsys.readouterr().err
    fresh = str(tmp_path / "fresh")
    assert main(["export", "executorch", "-m", snap, "-o", fresh]) == 2  # refused before any work
    assert "setup_executorch_env.sh" in capsys.readouterr().err and not os.path.exists(fresh)


def test_export_refuses_a_non_empty_folder_and_another_checkpoint(bundle, tiny_snapshot, tmp_path, capsys):
    snap, out = bundle
    assert main(["export", "executorch", "-m", snap, "-o", out]) == 2
    assert "--force" in capsys.readouterr().err
    other = tiny_snapshot("custom_voice", seed=1)
    speaker = ModelConfig.from_dir(other).speakers[0]
    _, argv = _say(["-m", other, "--plan", os.path.join(out, "plan.json"), "--speaker", speaker], tmp_path, "o")
    assert main(argv) == 2
    assert "another checkpoint" in capsys.readouterr().err


def test_plain_talker_step_equals_the_talker(tiny_snapshot):
    """The exported talker step, run eagerly one position at a time, equals the core talker."""
    from qtts.export.graphs import PlainTalkerStep
    from qtts.weights import load_checkpoint

    talker = load_checkpoint(tiny_snapshot("custom_voice"), components=("talker",)).model.talker.float().eval()
    cfg = talker.cfg
    step = PlainTalkerStep(talker, 16)
    x = torch.randn(1, 6, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    kv = torch.zeros(cfg.num_hidden_layers, 2, cfg.num_key_value_heads, 16, cfg.head_dim)
    with torch.no_grad():
        want, hidden, _ = talker(x, 0, talker.new_cache(16))
        for pos in range(6):
            logits, h, kv = step(x[:, pos : pos + 1], torch.tensor([pos]), kv)
            torch.testing.assert_close(logits[0], want[0, pos], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(h[0], hidden[0, pos], rtol=1e-4, atol=1e-5)
    assert float(kv[:, :, :, 6:].abs().max()) == 0.0  # slots after the last position stay untouched
