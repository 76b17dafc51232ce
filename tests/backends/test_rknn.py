"""RKNN: the on-board decoder against a fake rknnlite runtime, and a real build + simulator check."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from qtts.audio.chunk import snr_db
from qtts.backends.onnx import OnnxVocoder
from qtts.backends.rknn import RknnVocoder
from qtts.backends.vocoder_step import rope_freqs
from qtts.cli import main
from qtts.errors import InputError, MissingDependencyError, QttsError
from qtts.export import rknn as rknn_export
from qtts.export.vocoder import export_vocoder_onnx
from support.vocoder_fixtures import feed, full_decode, load_decoder, random_codes


@pytest.fixture(scope="module")
def steps(tiny_snapshot, tmp_path_factory, one_thread):
    """Tiny ONNX steps (B=16 main, B=2 first) posing as .rknn files with their contract sidecars."""
    snap = tiny_snapshot()
    out = tmp_path_factory.mktemp("voc-rknn")
    paths = {}
    for key, b in (("main", 16), ("first", 2)):
        onnx_path = str(out / f"voc{b}.onnx")
        export_vocoder_onnx(snap, b, onnx_path)
        fake = str(out / f"voc{b}.rknn")
        os.symlink(onnx_path, fake)
        with open(fake + ".json", "w") as fh:
            fh.write(OnnxVocoder(onnx_path).contract.to_json())
        paths[key] = fake
    return snap, paths, out


class FakeRKNNLite:
    """The rknnlite.api.RKNNLite surface qtts uses, computing with onnxruntime."""

    instances: list = []

    def __init__(self, fail_init: bool = False):
        self.fail_init, self.released, self.sess = fail_init, False, None
        FakeRKNNLite.instances.append(self)

    def load_rknn(self, path):
        import onnxruntime as ort

        self.sess = ort.InferenceSession(os.path.realpath(path), providers=["CPUExecutionProvider"])
        return 0

    def init_runtime(self, core_mask=None):
        return -1 if self.fail_init else 0

    def inference(self, inputs):
        names = [i.name for i in self.sess.get_inputs()]
        assert [a.dtype for a in inputs] == [np.int64, np.float32, np.float32, np.float32]
        return self.sess.run(None, dict(zip(names, inputs)))

    def release(self):
        self.released = True


def test_rknn_decoder_with_fake_runtime(steps):
    snap, paths, _ = steps
    decoder = load_decoder(snap)
    codes = random_codes(100, seed=9)
    ref = full_decode(decoder, codes)
    FakeRKNNLite.instances.clear()
    voc = RknnVocoder(paths["main"], paths["first"], runtime_factory=FakeRKNNLite)
    assert voc.sizes == [16, 2] and len(FakeRKNNLite.instances) == 2
    out = feed(voc.stream(), codes, [2, 8, 16, 3])
    assert snr_db(ref, out) >= 80.0
    voc.close()
    assert all(rt.released for rt in FakeRKNNLite.instances)


def test_rknn_decoder_errors(steps, tmp_path):
    _, paths, _ = steps
    with pytest.raises(QttsError, match="init_runtime"):
        RknnVocoder(paths["main"], runtime_factory=lambda: FakeRKNNLite(fail_init=True))
    lonely = tmp_path / "x.rknn"
    lonely.write_bytes(b"")
    with pytest.raises(InputError, match="qtts export rknn"):
        RknnVocoder(str(lonely), runtime_factory=FakeRKNNLite)


def test_converter_rope_equals_host_rope():
    inv = np.array([1.0, 0.3, 0.01, 1e-4], dtype=np.float32)
    assert np.array_equal(rknn_export.rope_freqs(1234, 16, inv), rope_freqs(1234, 16, inv))


def test_missing_converter_env_prints_the_command(steps, capsys):
    _, paths, out = steps
    onnx_path = os.path.realpath(paths["main"])
    with pytest.raises(MissingDependencyError, match="setup_rknn_env.sh"):
        rknn_export.compile_rknn(onnx_path, "rk3588", python=str(out / "no-python"))
    assert (
        main(["export", "rknn", "--onnx", onnx_path, "--target", "rk3588", "--python", str(out / "nope")])
        == 2  # a missing dependency: the user installs it (exit 2, as for a missing extra)
    )
    assert "setup_rknn_env.sh" in capsys.readouterr().err
    assert main(["export", "rknn", "--onnx", str(out / "missing.onnx"), "--target", "rk3588"]) == 2


@pytest.mark.rknn
def test_rknn_build_and_simulator(steps, capsys):
    """Compiles the tiny B=16 step for rk3588 in .venv-rknn (scripts/setup_rknn_env.sh) and checks it
    against onnxruntime in the toolkit's simulator (>= 40 dB).

    fp16 is the limit, not the graph: the random vocoder's audio follows its codes (O(1) activations
    through the whole conv stack), and the plain torch decode in fp16 gives 45.8 dB on it (the RKNN
    simulator 45.7 dB). The 50 dB default gate is for real weights (56.8 dB measured on a board)."""
    _, paths, out = steps
    assert rknn_export.converter_python() is not None, rknn_export.setup_hint()
    target = str(out / "voc16_rk3588.rknn")
    code = main(
        ["export", "rknn", "--onnx", os.path.realpath(paths["main"]), "--target", "rk3588", "-o", target,
         "--gate", "40"]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert os.path.getsize(target) > 0 and os.path.getsize(target + ".build.log") > 0
    with open(target + ".json") as fh:
        assert json.load(fh)["codes_length"] == 16
    snr = float(text.split("simulator vs onnxruntime stepwise: SNR ")[1].split(" dB")[0])
    assert snr >= 40.0
    assert '"impl": "rknn"' in text
    assert not list(out.glob("check*.onnx"))  # the toolkit's scratch files stay out of the output dir
