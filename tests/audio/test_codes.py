"""Codes in and out: ``qtts say --codes-out`` then ``qtts decode`` gives the audio of ``say``
(x-vector, ICL, CustomVoice; torch and ONNX vocoders), the API equivalent, and the checks on
codes files and paths."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

import qtts
from qtts.audio.chunk import snr_db
from qtts.audio.codes import load_codes, save_codes
from qtts.cli import main
from qtts.errors import InputError
from qtts.options import SynthesisOptions

TEXT = ("Hello there, this first sentence is long enough to fill more than half of one text piece on its own, as it goes. "
        "How are you today, and what would you like me to read out loud for you this time, my friend?")  # two pieces (over 200 characters): the frames of both, in order
SAY = ["--max-frames", "6", "--seed", "1", "--threads", "1", "-q"]
CASES = {  # name: (checkpoint kind, say flags, codes file)
    "xvector": ("base", ["--ref-audio", "REF"], "codes.npy"),
    "icl": ("base", ["--ref-audio", "REF", "--ref-text", "A reference transcript."], "codes.npz"),
    "custom_voice": ("custom_voice", ["--speaker", "ryan"], "codes.npy"),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch at one thread for this module


@pytest.fixture(scope="module")
def ref_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.wav"
    t = np.arange(24000 * 2) / 24000
    wav = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))
    sf.write(str(path), wav.astype(np.float32), 24000)
    return str(path)


@pytest.fixture(scope="module")
def onnx_plans(tiny_bundle):
    """An ONNX vocoder bundle (``qtts export onnx --components vocoder``) per checkpoint kind."""
    return {kind: os.path.join(tiny_bundle(kind, "--components", "vocoder"), "plan.json") for kind in ("base", "custom_voice")}


def _pcm(path) -> np.ndarray:
    data, sr = sf.read(str(path), dtype="int16")
    assert sr == 24000
    return data


def _say(snap, args, out, codes, *extra):
    assert main(["say", TEXT, "-m", snap, "-o", str(out), "--codes-out", str(codes), *SAY, *args, *extra]) == 0


def _decode(snap, codes, out, *extra):
    assert main(["decode", str(codes), "-m", snap, "-o", str(out), "-q", *extra]) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_codes_round_trip_torch_and_onnx(tiny_snapshot, ref_wav, onnx_plans, tmp_path, case):
    kind, args, name = CASES[case]
    snap, plan = tiny_snapshot(kind=kind), onnx_plans[kind]
    args = [ref_wav if a == "REF" else a for a in args]
    _say(snap, args, tmp_path / "say.wav", tmp_path / name)
    codes, prime, codec = load_codes(str(tmp_path / name))
    assert codes.shape == (12, 16) and codes.dtype == np.int64  # 2 pieces x 6 frames, in order
    assert (prime is not None) == (case == "icl")
    assert codec == (qtts.load(snap, parts=("vocoder",)).codec if name.endswith(".npz") else None)
    said = _pcm(tmp_path / "say.wav")
    assert len(said) == 12 * 1920 and np.abs(said).max() > 1000

    _decode(snap, tmp_path / name, tmp_path / "torch.wav")
    assert np.array_equal(_pcm(tmp_path / "torch.wav"), said)  # torch say -> torch decode: the same samples
    _decode(snap, tmp_path / name, tmp_path / "onnx.wav", "--plan", plan)
    assert snr_db(said.astype(np.float64), _pcm(tmp_path / "onnx.wav").astype(np.float64)) >= 80.0

    _say(snap, args, tmp_path / "osay.wav", tmp_path / f"o{name}", "--plan", plan)
    ocodes = load_codes(str(tmp_path / f"o{name}")).codes
    assert np.array_equal(ocodes, codes)  # the vocoder runtime does not touch generation
    _decode(snap, tmp_path / f"o{name}", tmp_path / "odec.wav", "--plan", plan)
    assert np.array_equal(_pcm(tmp_path / "odec.wav"), _pcm(tmp_path / "osay.wav"))  # same plan: the same samples


def test_icl_npy_decodes_with_the_voice(tiny_snapshot, ref_wav, tmp_path, capsys):
    """An .npy of an ICL voice needs that voice's reference codes (--voice); without them the audio differs."""
    snap = tiny_snapshot()
    voice = tmp_path / "me.voice"
    assert main(["voice", "create", ref_wav, "-m", snap, "--ref-text", "A reference.", "-o", str(voice),
                 "--threads", "1"]) == 0
    args = ["say", TEXT, "-m", snap, "--voice", str(voice), "-o", str(tmp_path / "say.wav"),
            "--codes-out", str(tmp_path / "c.npy"), "--max-frames", "6", "--seed", "2", "--threads", "1"]
    assert main(args) == 0
    assert "--voice" in capsys.readouterr().err  # the note: decode this .npy with the same voice
    said = _pcm(tmp_path / "say.wav")
    _decode(snap, tmp_path / "c.npy", tmp_path / "with.wav", "--voice", str(voice))
    _decode(snap, tmp_path / "c.npy", tmp_path / "without.wav")
    assert np.array_equal(_pcm(tmp_path / "with.wav"), said)
    assert not np.array_equal(_pcm(tmp_path / "without.wav"), said)


def test_api_chunks_carry_their_codes_and_decode_reproduces_stream(real_tts, ref_wav):
    voice = real_tts.create_voice(ref_wav, ref_text="A reference.")
    opts = SynthesisOptions(seed=3, max_frames=7, first_chunk_frames=3, chunk_frames=5)
    chunks = list(real_tts.stream(TEXT, voice=voice, options=opts))
    for chunk in chunks:
        assert chunk.codes.shape == (chunk.num_frames, 16) and chunk.codes.dtype == np.int64
    audio = real_tts.synthesize(TEXT, voice=voice, options=opts)
    assert np.array_equal(audio.codes, np.concatenate([c.codes for c in chunks])) and len(audio.codes) == 14
    again = real_tts.decode(audio.codes, prime=voice.ref_codes, options=opts)
    assert np.array_equal(again.samples, audio.samples) and np.array_equal(again.codes, audio.codes)
    assert [c.num_frames for c in real_tts.decode_stream(audio.codes, voice.ref_codes, opts)] == [3, 5, 5, 1]
    unprimed = real_tts.decode(audio.codes, options=opts).samples
    assert snr_db(audio.samples, unprimed) < 30  # the prime matters


def test_vocoder_only_load(tiny_snapshot, onnx_plans, real_tts, ref_wav):
    """parts=("vocoder",) loads no talker, tokenizer or encoders; decode on it equals the full model's."""
    tts = qtts.load(tiny_snapshot(), plan=onnx_plans["base"], threads=1, parts=("vocoder",))
    parts = tts.components
    assert parts.backend is None and parts.tokenizer is None and parts.speaker_encoder is None
    assert type(parts.vocoder).__name__ == "OnnxVocoder"
    with pytest.raises(InputError, match="without the generation"):
        tts.stream("Hi.", voice=real_tts.create_voice(ref_wav))
    with pytest.raises(InputError, match="unknown part"):
        qtts.load(tiny_snapshot(), parts=("talker",))
    codes = np.random.default_rng(0).integers(0, 2048, (11, 16))
    full = real_tts.decode(codes).samples
    assert snr_db(full, tts.decode(codes).samples) >= 80.0  # ONNX vocoder vs torch, float samples


def test_decode_with_an_onnx_vocoder_needs_no_torch(tiny_snapshot, onnx_plans, tmp_path):
    """`qtts decode --plan` with an ONNX vocoder runs with torch unimportable (only the vocoder is built)."""
    snap = tiny_snapshot()
    codes = np.random.default_rng(1).integers(0, 2048, (9, 16))
    np.save(tmp_path / "c.npy", codes)
    block = ("import sys; sys.modules['torch'] = None; from qtts.cli import main; rc = main(sys.argv[1:]); "
             "assert sys.modules['torch'] is None; sys.exit(rc)")
    argv = ["decode", str(tmp_path / "c.npy"), "-m", snap, "--plan", onnx_plans["base"], "-o", str(tmp_path / "a.wav")]
    proc = subprocess.run([sys.executable, "-c", block, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "frames=9 audio=0.72s" in proc.stderr and "finish_reason" not in proc.stderr  # decoding has none
    _decode(snap, tmp_path / "c.npy", tmp_path / "b.wav", "--plan", onnx_plans["base"])
    assert np.array_equal(_pcm(tmp_path / "a.wav"), _pcm(tmp_path / "b.wav"))


@pytest.mark.parametrize("array,words", [
    (np.zeros(16, dtype=np.int64), "shape [frames, 16], got shape (16,)"),
    (np.zeros((4, 8), dtype=np.int64), "got shape (4, 8)"),
    (np.zeros((4, 16), dtype=np.float32), "must be integers, got dtype float32"),
    (np.zeros((0, 16), dtype=np.int64), "no frames"),
    (np.full((4, 16), 2048, dtype=np.int64), "frame 0 codebook 0 is 2048 (64 such codes)"),
    (np.pad(np.full((1, 1), -1), ((2, 1), (3, 12))), "frame 2 codebook 3 is -1 (1 such code)"),
])
def test_decode_refuses_bad_arrays_before_loading(tmp_path, capsys, array, words):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    assert main(["decode", str(path), "-m", "no-such-model", "-o", str(tmp_path / "x.wav")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and err.startswith("qtts: error: ") and len(err.splitlines()) == 1
    assert not (tmp_path / "x.wav").exists()


def test_decode_refuses_bad_files(tmp_path, capsys):
    good = np.zeros((3, 16), dtype=np.int64)
    np.savez(tmp_path / "nocodes.npz", frames=good)
    np.savez(tmp_path / "extra.npz", codes=good, prime=good, notes=good)
    np.savez(tmp_path / "codec.npz", codes=good, codec=np.arange(3))
    np.save(tmp_path / "objects.npy", np.array([good, "x"], dtype=object), allow_pickle=True)
    (tmp_path / "text.npy").write_text("hello")
    (tmp_path / "me.wav").write_bytes(b"RIFF" + b"\0" * 60)  # audio given where codes go: not numpy's pickle text
    cases = {"me.wav": "me.wav: it is WAV audio, not codes; qtts decode takes codec frames saved by qtts say","missing.npy": "no such file", "nocodes.npz": "holds frames", "extra.npz": "holds codes, prime, notes",
             "codec.npz": "'codec' must be one string",
             "objects.npy": "holds Python objects, not integer codes", "text.npy": "not a .npy or .npz file",
             ".": "is a directory"}
    for name, words in cases.items():
        assert main(["decode", str(tmp_path / name), "-m", "M", "-o", str(tmp_path / "x.wav")]) == 2, name
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1 and "pickle" not in err, (name, err)
    np.save(tmp_path / "ok.npy", good)
    assert main(["decode", str(tmp_path / "ok.npy"), "-m", "M", "-o", str(tmp_path / "x.mp4")]) == 2
    assert "cannot tell the audio format" in capsys.readouterr().err


def test_voice_must_agree_with_the_files_prime(tiny_snapshot, ref_wav, real_tts, tmp_path, capsys):
    voice = real_tts.create_voice(ref_wav, ref_text="A reference.")
    voice.save(str(tmp_path / "me.voice"))
    save_codes(str(tmp_path / "c.npz"), np.ones((3, 16), dtype=np.int64), prime=voice.ref_codes[:-1])
    rc = main(["decode", str(tmp_path / "c.npz"), "-m", tiny_snapshot(), "--voice", str(tmp_path / "me.voice"),
               "-o", str(tmp_path / "x.wav")])
    assert rc == 2 and "holds other reference codes" in capsys.readouterr().err


def test_codes_from_another_checkpoint_are_refused(tiny_snapshot, ref_wav, real_tts, tmp_path, capsys):
    """An .npz names its speech tokenizer (codec); decoding it with another checkpoint's exits 2 naming the fix."""
    snap, other = tiny_snapshot(), tiny_snapshot(seed=1)  # one layout, other random weights
    _say(snap, ["--ref-audio", ref_wav], tmp_path / "say.wav", tmp_path / "c.npz")
    codes, _, codec = load_codes(str(tmp_path / "c.npz"))
    assert codec == real_tts.codec and len(codec) == 16
    rc = main(["decode", str(tmp_path / "c.npz"), "-m", other, "-o", str(tmp_path / "x.wav")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and not (tmp_path / "x.wav").exists()
    assert f"made with another checkpoint's speech tokenizer (codec {codec})" in err
    assert f"--model {other} has codec" in err and "pass the checkpoint that made the codes" in err
    other_tts = qtts.load(other, threads=1, parts=("vocoder",))
    with pytest.raises(InputError, match="another speech tokenizer"):
        other_tts.decode(codes, codec=codec)  # the API checks the same
    assert np.array_equal(real_tts.decode(codes, codec=codec).samples, real_tts.decode(codes).samples)
    # another kind with the same speech tokenizer (as the official 0.6B / 1.7B share theirs) decodes them
    _decode(tiny_snapshot(kind="custom_voice"), tmp_path / "c.npz", tmp_path / "cv.wav")
    assert np.array_equal(_pcm(tmp_path / "cv.wav"), _pcm(tmp_path / "say.wav"))


def test_decode_reproduces_say_at_another_speed(tiny_snapshot, ref_wav, tmp_path):
    """say --speed stretches the audio, not the frames: decode --speed with the same value gives its audio."""
    snap = tiny_snapshot()
    _say(snap, ["--ref-audio", ref_wav], tmp_path / "say.wav", tmp_path / "c.npy", "--speed", "1.5")
    said = _pcm(tmp_path / "say.wav")
    assert len(load_codes(str(tmp_path / "c.npy")).codes) == 12 and abs(len(said) - 12 * 1920 / 1.5) < 1920
    _decode(snap, tmp_path / "c.npy", tmp_path / "fast.wav", "--speed", "1.5")
    _decode(snap, tmp_path / "c.npy", tmp_path / "plain.wav")
    assert np.array_equal(_pcm(tmp_path / "fast.wav"), said)
    assert len(_pcm(tmp_path / "plain.wav")) == 12 * 1920


@pytest.mark.parametrize("path,words", [
    ("{t}/missing/c.npy", "does not exist"),
    ("{t}/c.txt", "ending in .npy or .npz"),
    ("{t}", "is a directory"),
])
def test_codes_out_checked_before_any_work(tmp_path, capsys, path, words):
    path = path.replace("{t}", str(tmp_path))
    rc = main(["say", "Hi.", "-m", "no-such-model", "-o", str(tmp_path / "a.wav"), "--codes-out", path])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"qtts: error: --codes-out {path}: ") and words in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_codes_files_are_atomic_and_follow_the_umask(tmp_path, monkeypatch, umask):
    codes = np.arange(32).reshape(2, 16)
    old = os.umask(umask)
    try:
        for name in ("c.npy", "c.npz"):
            save_codes(str(tmp_path / name), codes, prime=codes)
            assert os.stat(tmp_path / name).st_mode & 0o777 == 0o666 & ~umask
        monkeypatch.setattr(np, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
        with pytest.raises(OSError):
            save_codes(str(tmp_path / "d.npy"), codes)
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == ["c.npy", "c.npz"]  # no partial file, no temp left
    frames, prime, codec = load_codes(str(tmp_path / "c.npy"))
    assert np.array_equal(frames, codes) and prime is None and codec is None  # an .npy keeps no prime
    assert np.array_equal(load_codes(str(tmp_path / "c.npz")).prime, codes)
    with pytest.raises(InputError, match="ends in .npy or .npz"):
        save_codes(str(tmp_path / "c.bin"), codes)


@pytest.mark.parametrize("flag", ["--temperature", "--repetition-penalty"])
def test_tiny_sampling_values_name_the_flag(capsys, flag):
    """1e-39 is a positive float but below the sampling lower bound (0.01): exit 2 naming the flag."""
    assert main(["say", "Hi.", "-m", "M", "-o", "x.wav", flag, "1e-39"]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be >= 0.01, got 1e-39" in err


@pytest.mark.parametrize("flag,value,words", [
    ("--temperature", "1e9", "must be <= 100.0"), ("--temperature", "inf", "must be <= 100.0"),
    ("--temperature", "nan", "expected a number, got 'nan'"), ("--temperature", "0", "must be >= 0.01"),
    ("--repetition-penalty", "nan", "expected a number"), ("--repetition-penalty", "1e3", "must be <= 100.0"),
    ("--top-p", "0", "must be > 0"), ("--top-p", "1.5", "must be <= 1"), ("--top-p", "nan", "expected a number"),
    ("--top-k", "-1", "must be >= 0"), ("--max-frames", "0", "must be >= 1"), ("--speed", "5", "must be <= 4.0"),
])
def test_out_of_range_sampling_values_exit_2(tmp_path, capsys, flag, value, words):
    """Every sampling value out of its range exits 2 naming the flag, before the model is looked at."""
    assert main(["say", "Hi.", "-m", "no-such-model", "-o", str(tmp_path / "x.wav"), flag, value]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {words}" in err and "no-such-model" not in err
    assert os.listdir(tmp_path) == []

