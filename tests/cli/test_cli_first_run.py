"""First-run rough edges of the CLI: output paths checked first (exit 2, one line), file modes
follow the umask, the format follows the extension, progress without \\r in logs, CLI words in errors."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from qtts.audio.chunk import AudioChunk
from qtts.audio.writers import AUDIO_FORMATS, AudioWriter, write_audio
from qtts.cli import build_parser, main
from qtts.cli.common import Progress
from qtts.cli.main import BROKEN_PIPE

SAY = ["--max-frames", "4", "--seed", "1", "--threads", "1", "-q", "--no-split"]


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err


@pytest.mark.parametrize("argv,words", [
    (["demo", "-o", "{t}/missing/d.wav"], "does not exist"),
    (["demo", "-o", "{t}"], "is a directory"),
    (["demo", "-o", "{t}/d.xyz"], ".wav, .flac, .mp3, .opus, .pcm"),
    (["say", "Hi.", "-m", "M", "-o", "{t}/missing/x.wav"], "does not exist"),
    (["say", "Hi.", "-m", "M", "-o", "{t}/x.ogg"], ".wav, .flac, .mp3, .opus, .pcm"),
    (["say", "Hi.", "-m", "M", "-o", "{t}/noext"], "cannot tell the audio format"),
    (["voice", "create", "ref.wav", "-m", "M", "-o", "{t}/missing/me.voice"], "does not exist"),
    (["random-checkpoint", "{t}/file.txt"], "exists and is not a folder"),
    (["random-checkpoint", "{t}/full"], "--force"),
    (["random-checkpoint", "-o", "{t}/full"], "--force"),
    (["random-checkpoint"], "give one output folder"),
    (["export", "onnx", "-m", "M", "-o", "{t}/full"], "--force"),
    (["export", "onnx", "-m", "M", "-o", "{t}/file.txt"], "exists and is not a folder"),
    (["export", "qnn", "-m", "M", "-o", "{t}/file.txt"], "exists and is not a folder"),
    (["export", "vocoder", "-m", "M", "-o", "{t}/v.bin"], "ending in .onnx"),
    (["export", "vocoder", "-m", "M", "-o", "{t}/missing/v.onnx"], "does not exist"),
    (["export", "rknn", "--onnx", "v.onnx", "--target", "rk3588", "-o", "{t}/missing/v.rknn"], "does not exist"),
    (["verify", "plan", "-m", "M", "--report", "{t}/missing/fid.md"], "does not exist"),
    (["bench", "-m", "M", "--json", "{t}/missing/b.json"], "does not exist"),
])
def test_output_path_checked_before_any_work(tmp_path, capsys, argv, words):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old").write_text("x")
    before = sorted(os.listdir(tmp_path))
    assert main([a.replace("{t}", str(tmp_path)) for a in argv]) == 2
    err = _err_line(capsys)
    assert words in err and err.startswith("qtts: error: ")
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no model loaded ('M' does not exist)


def test_force_passes_the_folder_check(tmp_path, capsys):
    (tmp_path / "old").write_text("x")
    assert main(["export", "onnx", "-m", str(tmp_path / "no-model"), "-o", str(tmp_path), "--force"]) == 2
    err = _err_line(capsys)
    assert "no such snapshot directory" in err and "--force" not in err  # got past the output check


@pytest.mark.parametrize("argv,flag", [
    (["say", "Hi.", "-m", "M", "-o", "x.wav", "--temperature", "0"], "--temperature"),
    (["say", "Hi.", "-m", "M", "-o", "x.wav", "--max-frames", "0"], "--max-frames"),
    (["say", "Hi.", "-m", "M", "-o", "x.wav", "--top-p", "1.5"], "--top-p"),
    (["say", "Hi.", "-m", "M", "-o", "x.wav", "--chunk-frames", "0"], "--chunk-frames"),
    (["say", "Hi.", "-m", "M", "-o", "x.wav", "--threads", "0"], "--threads"),
    (["export", "vocoder", "-m", "M", "-o", "x.onnx", "--chunk-frames", "0"], "--chunk-frames"),
    (["bench", "-m", "M", "--frames", "2"], "--frames"),
])
def test_bad_numbers_name_the_flag(capsys, argv, flag):
    assert main(argv) == 2
    err = _err_line(capsys)
    assert f"argument {flag}: must be" in err and "--help" in err


def test_model_sizes_and_flags_spelled_as_users_do(tiny_snapshot, tmp_path, capsys):
    rc = main(["say", "Hi.", "-m", tiny_snapshot(), "--speaker", "ryan", "-o", str(tmp_path / "x.wav"), *SAY])
    err = _err_line(capsys)
    assert rc == 2 and "0.6b" in err and "0b6" not in err
    rc = main(["say", "Hi.", "-m", tiny_snapshot(kind="custom_voice", layout="1.7b"), "--ref-audio", "me.wav",
               "-o", str(tmp_path / "x.wav"), *SAY])
    err = _err_line(capsys)
    assert rc == 2 and "--speaker <one of: " in err and "--instruct TEXT" in err and "speaker=" not in err


def test_pcm_to_a_terminal_is_refused(monkeypatch, tmp_path, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    assert main(["say", "Hi.", "-m", "M", "-o", "-"]) == 2
    assert "terminal" in _err_line(capsys)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_follow_the_umask(tiny_snapshot, tmp_path, umask):
    import torch

    from qtts.export.onnx import ExportOptions, export_bundle
    from qtts.export.write import export_single_file, save_model
    from qtts.voice import Voice

    old = os.umask(umask)
    try:
        write_audio(str(tmp_path / "a.wav"), np.zeros(1920, dtype=np.float32))
        write_audio(str(tmp_path / "a.flac"), np.zeros(1920, dtype=np.float32))
        Voice(speaker=np.ones(8, dtype=np.float32), model_size="0b6").save(str(tmp_path / "me.voice"))
        export_single_file(torch.nn.Linear(32, 32), (torch.zeros(1, 32),), str(tmp_path / "step.onnx"),
                           ["x"], ["y"], {"k": "v"})
        import onnx

        save_model(onnx.load(str(tmp_path / "step.onnx")), str(tmp_path / "bundle.onnx"))  # + bundle.onnx.data
        export_bundle(tiny_snapshot(), str(tmp_path / "b"), ExportOptions(components=()))  # plan + manifest
    finally:
        os.umask(old)
    names = ["a.wav", "a.flac", "me.voice", "step.onnx", "bundle.onnx", "bundle.onnx.data", "b/plan.json",
             "b/manifest.json"]
    modes = {n: oct(stat.S_IMODE(os.stat(tmp_path / n).st_mode)) for n in names}
    assert modes == {n: oct(0o666 & ~umask) for n in names}
    assert oct(stat.S_IMODE(os.stat(tmp_path / "b").st_mode)) == oct(0o777 & ~umask)  # not mkdtemp's 0700
    assert sorted(os.listdir(tmp_path)) == sorted([n for n in names if "/" not in n] + ["b"])  # no temp files


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_writer_format_from_extension(tmp_path, fmt):
    path = str(tmp_path / f"out.{fmt}")
    samples = (0.3 * np.sin(np.arange(9600) * 0.05)).astype(np.float32)
    with AudioWriter(path) as w:
        w.write(samples[:4800])
        w.write(samples[4800:])
    if fmt == "pcm":
        assert os.path.getsize(path) == 2 * 9600
        return
    info = sf.info(path)
    expected = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
                "opus": ("OGG", "OPUS")}[fmt]
    assert (info.format, info.subtype) == expected and info.samplerate == 24000 and info.channels == 1
    decoded, _ = sf.read(path, dtype="float32")
    assert abs(len(decoded) - 9600) <= 2400  # lossy codecs pad / trim a little


def test_say_writes_mp3_and_demo_writes_flac(tiny_snapshot, tmp_path, capsys):
    out = tmp_path / "hello.mp3"
    assert main(["say", "Hi.", "-m", tiny_snapshot(kind="custom_voice"), "--speaker", "ryan", "-o", str(out),
                 *SAY]) == 0, capsys.readouterr().err
    assert sf.info(str(out)).format == "MP3"
    assert main(["demo", "-o", str(tmp_path / "demo.flac"), "--text", "Hi."]) == 0
    assert sf.info(str(tmp_path / "demo.flac")).format == "FLAC"


def _chunk(frames: int) -> AudioChunk:
    info = {"frames": frames, "wall_s": 0.5, "audio_s": frames / 12.5, "rtf": 0.5, "ttfa_s": 0.1}
    return AudioChunk(np.zeros(1920, dtype=np.float32), info=info, finish_reason="eos")


@pytest.mark.parametrize("tty", [False, True])
def test_progress_plain_lines_in_logs(monkeypatch, tty):
    class Err(io.StringIO):
        def isatty(self):
            return tty

    err = Err()
    monkeypatch.setattr(sys, "stderr", err)
    progress = Progress(quiet=False)
    for frames in (2, 10):
        progress.update(_chunk(frames))
    progress.summary(_chunk(10))
    text = err.getvalue()
    if tty:
        assert text.count("\r") == 3 and text.count("\n") == 1
    else:
        assert "\r" not in text and text.splitlines()[0] == "qtts: 2 frames, 0.16 s audio, 0.5 s"
        assert len(text.splitlines()) == 3


def test_help_says_what_to_run(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "start here:" in out.split("commands:")[0] and "qtts COMMAND --help" in out
    lines = out.splitlines()
    assert lines[4] == "start here:" and lines[5].split()[:2] == ["qtts", "demo"]  # near the top
    assert main(["say", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: qtts say") and "picked by qtts from the model size" in " ".join(out.split())
    assert main([]) == 2 and "start here:" in capsys.readouterr().err


@pytest.mark.parametrize("argv,dest,value", [
    (["say", "-m", "M", "-o", "x", "--chunk", "4"], "chunk_frames", 4),
    (["say", "-m", "M", "-o", "x", "--first-chunk", "3"], "first_chunk_frames", 3),
    (["export", "vocoder", "-m", "M", "-o", "x", "--codes-length", "16"], "chunk_frames", 16),
    (["export", "qnn", "-m", "M", "-o", "x", "--codes-length", "2"], "chunk_frames", 2),
    (["export", "onnx", "-m", "M", "-o", "x", "--vocoder-main", "4"], "chunk_frames", 4),
    (["export", "onnx", "-m", "M", "-o", "x", "--vocoder-first", "1"], "first_chunk_frames", 1),
    (["export", "onnx", "-m", "M", "-o", "x", "--speech-decoder-from", "b"], "vocoder_from", "b"),
    (["verify", "vocoder", "-m", "M", "--chunks", "2,16", "--chunks", "4"], "chunk_frames", ["2,16", "4"]),
    (["random-checkpoint", "x", "--overwrite"], "force", True),
    (["export", "onnx", "-m", "M", "-o", "x", "--components", "talker", "code_predictor", "speech_decoder"],
     "components", ["talker", "predictor", "vocoder"]),
])
def test_old_flag_spellings_still_work(argv, dest, value):
    with contextlib.redirect_stderr(io.StringIO()):
        args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value


def test_unknown_component_lists_the_valid_ones(capsys):
    assert main(["export", "onnx", "-m", "M", "-o", "x", "--components", "decoder"]) == 2
    err = capsys.readouterr().err
    assert "argument --components: invalid choice: 'decoder'" in err
    assert "talker, predictor, vocoder, speaker_encoder, speech_encoder" in err


def test_export_choices_match_the_exporters():
    """The parser keeps its own copies (it must not import qtts.export); they must not drift."""
    from qtts.cli import export as cli
    from qtts.export import onnx, quantize, rknn

    assert cli.PRECISIONS == onnx.PRECISIONS and cli.PREDICTOR_MODES == onnx.PREDICTOR_MODES
    assert cli.DEFAULT_BLOCK_SIZE == quantize.DEFAULT_BLOCK_SIZE and cli.RKNN_TARGETS == rknn.TARGETS
    from qtts.cli import export_et
    from qtts.export import executorch

    assert export_et.WEIGHTS == executorch.WEIGHTS


NO_EXPORT = """
import sys
from qtts.cli import build_parser, main
build_parser()
rc = main(["say", "--help"])
loaded = sorted(m for m in sys.modules if m.startswith("qtts.export") or m in ("torch", "onnx"))
assert rc == 0 and loaded == [], loaded
"""


def test_the_parser_does_not_import_the_export_toolchain():
    proc = subprocess.run([sys.executable, "-c", NO_EXPORT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: qtts say")


def test_pcm_pipe_closed_early_exits_quietly(tiny_snapshot):
    """`qtts say ... -o - | head -c 100`: the reader goes away after 100 bytes of a long stream."""
    argv = [sys.executable, "-m", "qtts", "say", "Hello there, this is a longer sentence.", "-o", "-",
            "-m", tiny_snapshot(kind="custom_voice"), "--speaker", "ryan", "--max-frames", "64", "--seed", "1",
            "--threads", "1", "--no-split"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.read(100)
    proc.stdout.close()  # more than a pipe buffer (64 KiB = 17 frames) is still to come
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == BROKEN_PIPE, err[-3000:]
    assert len(head) == 100 and "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err


def test_serve_limits_are_checked_numbers(capsys):
    args = build_parser().parse_args(["serve", "-m", "M", "--header-timeout", "2.5", "--body-timeout", "30",
                                      "--write-timeout", "9", "--max-connections", "4"])
    assert (args.header_timeout, args.body_timeout, args.write_timeout, args.max_connections) == (2.5, 30, 9, 4)
    assert main(["serve", "-m", "M", "--max-connections", "0"]) == 2
    assert "argument --max-connections: must be" in capsys.readouterr().err
