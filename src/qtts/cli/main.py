"""``qtts``: the parser, ``main(argv)``, and the first-run commands ``demo`` and ``random-checkpoint``.

Exit codes: 0 success, 2 usage/input errors (:class:`~qtts.errors.InputError`) and a missing optional
dependency (an extra: one line with its install command), 1 runtime failures.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import time

from ..errors import InputError, MissingDependencyError, QttsError, missing_module_message
from .cache import register as register_cache
from .common import (
    Parser,
    check_audio,
    check_folder,
    cli_words,
    command,
    hidden_alias,
    number,
    setup_logging,
)
from .export import register as register_export
from .kernels import register as register_kernels
from .say import register as register_say
from .serve import register as register_serve
from .wyoming import register as register_wyoming

START = """\
start here:
  qtts demo                 the whole pipeline on a tiny random checkpoint (no download): demo.wav
  qtts say "Hello." -m Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --speaker vivian -o hello.wav
  qtts serve -m Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice    OpenAI-compatible API at http://127.0.0.1:8000/v1
  then open http://127.0.0.1:8000/                      the web page: type, pick a voice, play as it generates
  qtts COMMAND --help       the flags of one command
"""
SENTENCE = "Hello from qtts. This sentence went through every stage of the pipeline."
#: random talkers never stop by themselves: a call runs to its frame budget, 40 + 8 per text token
STANDIN_NOTE = ("stand-in tokenizer (no --tokenizer): it splits text into single bytes, so every call runs to a "
                "longer frame budget (\"Hello.\": 216 frames = 17 s; 56 with the real Qwen2 tokenizer); "
                "cap it with --max-frames, or pass --tokenizer DIR with the real vocab.json + merges.txt")
REAL_COMMAND = 'qtts say "Hello" --model Qwen/Qwen3-TTS-12Hz-0.6B-Base --ref-audio me.wav -o out.wav'


def build_parser() -> Parser:
    from ..version import __version__

    parser = Parser(prog="qtts", usage="qtts COMMAND [options]", formatter_class=argparse.RawDescriptionHelpFormatter,
                    description="Fast, streaming Qwen3-TTS inference and edge export.\n\n" + START)
    parser.add_argument("--version", action="version", version=f"qtts {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", prog="qtts")
    _register_demo(sub)
    register_say(sub)
    register_serve(sub)
    register_wyoming(sub)
    register_export(sub)
    register_cache(sub)
    register_kernels(sub)
    _register_random_checkpoint(sub)
    return parser


#: exit code when the reader of stdout goes away (``qtts say -o - | head -c 100``): 128 + SIGPIPE,
#: what a shell reports for any program stopped by a closed pipe
BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader closed the pipe: stop quietly, no traceback
        _stdout_to_devnull()
        return BROKEN_PIPE


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test harness: nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    setup_logging(args.verbose)
    if not hasattr(args, "_run"):  # `qtts` or `qtts export` alone
        getattr(args, "_group", parser).print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except (InputError, MissingDependencyError) as exc:  # a missing extra is fixed by the user: 2
        print(f"qtts: error: {cli_words(str(exc))}", file=sys.stderr)
        return 2
    except QttsError as exc:
        print(f"qtts: failed: {cli_words(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("qtts: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except OSError as exc:  # disk full, a file vanished, permissions changed meanwhile: no traceback
        logging.getLogger(__name__).debug("%s failed", args._run.__name__, exc_info=True)
        output = getattr(args, "output", None)
        print(f"qtts: failed: {os_error_message(exc, output if isinstance(output, str) else None)}",
              file=sys.stderr)
        return 1
    except ImportError as exc:  # `import torch` on a core-only install: an install hint, not a traceback
        run = args._run
        message = missing_module_message(exc, extra="export" if run.__module__.endswith((".export", ".bench")) else None,
                                         bundle=run.__name__ in ("run_say", "run_decode", "run_voice_create", "run"))
        if message is None:
            raise
        print(f"qtts: error: {message}", file=sys.stderr)
        return 2


#: errno -> what to do about it
_OS_FIXES = {errno.ENOSPC: "free some space there or write to another disk",
             errno.EDQUOT: "free some space there or write to another disk",
             errno.EROFS: "write to another folder", errno.EACCES: "check the permissions of the folder"}


def os_error_message(exc: OSError, output: str | None = None) -> str:
    """One line for an OSError: what failed, on which file, and the fix when there is a usual one.
    Some writers (numpy's ``tofile``) raise one without an errno: when the disk of ``output`` (the
    command's -o) is full, that is said."""
    code, what, where = exc.errno, exc.strerror or str(exc), exc.filename
    if code is None and output and not where:
        where = output
        if _disk_full(output):
            code, what = errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({exc})"
        else:
            what = f"writing the output failed ({exc})"
    fix = _OS_FIXES.get(code)
    return what + (f" ({where})" if where else "") + (f"; {fix}" if fix else "")


def _disk_full(path: str) -> bool:
    folder = os.path.dirname(os.path.abspath(path))
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


def _register_demo(sub) -> None:
    p = command(sub, "demo", run_demo, "run the whole pipeline on a tiny random-weight checkpoint "
                "(no download) and write demo.wav")
    p.add_argument("-o", "--output", default="demo.wav", help="output audio file (default: ./demo.wav)")
    p.add_argument("--tokenizer", help="a folder with the real Qwen2 vocab.json + merges.txt (default: stand-in)")
    p.add_argument("--text", default=SENTENCE, help="the sentence to synthesize")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights, the synthetic reference "
                   "voice and the sampling (default 0); the same seed writes the same demo.wav")
    p.add_argument("--threads", type=number(lo=1), default=1, help="CPU threads (default 1: fastest for the tiny model)")


def reference_audio(seconds: float = 3.0, seed: int = 0):
    """A synthetic 'voice': a vibrato tone with harmonics and noise (24 kHz)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(24000 * seconds)) / 24000.0
    phase = 2 * np.pi * np.cumsum(140.0 + 15.0 * np.sin(2 * np.pi * 4.0 * t)) / 24000.0
    wav = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + 0.01 * rng.standard_normal(len(t))
    return wav.astype(np.float32)


def run_demo(args) -> int:
    import tempfile

    from .. import load
    from ..audio.writers import AudioWriter
    from ..errors import require
    from ..options import SynthesisOptions
    from ..text.prompt import clean_text
    from ..tools.random_checkpoint import write_random_checkpoint

    if args.output == "-":
        raise InputError("-o -: the demo writes a file; give a file name such as demo.wav")
    fmt = check_audio(args.output)
    clean_text(args.text, what="--text")  # refused before minutes of work
    require("torch", "torch", "qtts demo (it builds and runs a random checkpoint)")
    print("qtts demo: tiny RANDOM weights -> the output is noise, not speech.")
    t = [time.perf_counter()]

    def done(what: str) -> None:
        t.append(time.perf_counter())
        print(f"  {what:<44} {t[-1] - t[-2]:6.2f} s")

    with tempfile.TemporaryDirectory(prefix="qtts-demo-") as tmp:
        snap = write_random_checkpoint(os.path.join(tmp, "tiny-base"), size="tiny", kind="base",
                                       seed=args.seed, tokenizer_dir=args.tokenizer)
        done("write tiny random checkpoint")
        tts = load(snap, plan="torch", threads=args.threads)
        done("load (config, tokenizer, torch backend)")
        voice = tts.create_voice((reference_audio(seed=args.seed), 24000), ref_text="A synthetic reference.")
        done(f"create voice (x-vector + {len(voice.ref_codes)} ICL frames)")
        chunks = tts.stream(args.text, voice=voice, options=SynthesisOptions(seed=args.seed, max_frames=40))
        n = 0
        with AudioWriter(args.output, fmt=fmt) as w:
            for last in chunks:
                w.write(last.samples)
                n += 1
        done(f"synthesize streaming ({n} chunks)")
    i = last.info
    print(f"  frames={i['frames']} audio={i['audio_s']:.2f}s wall={i['wall_s']:.2f}s rtf={i['rtf']:.2f} "
          f"ttfa={i['ttfa_s']:.2f}s finish_reason={last.finish_reason}")
    print(f"wrote {args.output}")
    print(f"Random weights make noise, not speech. For real speech use a real checkpoint:\n  {REAL_COMMAND}")
    return 0


def _register_random_checkpoint(sub) -> None:
    from ..tools.random_checkpoint import DTYPES, KINDS, LAYOUTS, SIZES

    p = command(sub, "random-checkpoint", run_random_checkpoint, "write a random-weight Qwen3-TTS snapshot "
                "(real layout and ids) for tests and benchmarks")
    p.add_argument("output", metavar="OUT", nargs="?", help="output folder (new or empty; or -o OUT)")
    p.add_argument("-o", "--output", dest="output_opt", metavar="OUT", help=argparse.SUPPRESS)
    p.add_argument("--size", choices=SIZES, default="tiny", help="tiny: shrunk widths (tests); mid: real widths, 1-2 layers (parity); full: real size (benchmarks)")
    p.add_argument("--kind", choices=KINDS, default="base", help="checkpoint kind (default: base)")
    p.add_argument("--layout", choices=LAYOUTS, default="0.6b", help="0.6b or 1.7b layout (default: 0.6b)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="copy the real Qwen2 vocab.json + merges.txt from DIR (default: a byte-level stand-in)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weight dtype (default: float32)")
    p.add_argument("--natural-eos", action="store_true",
                   help="bias the talker so greedy generation stops by itself after the text (EOS parity tests)")
    p.add_argument("--planted", action="store_true", help="plant real-weight structure (heavy-tailed weights, "
                   "outlier activation channels) for measuring 4-bit repairs (docs/fidelity.md)")
    p.add_argument("--force", action="store_true", help="replace OUT if it is not empty")
    hidden_alias(p, "--overwrite", dest="force", action="store_true")


def run_random_checkpoint(args) -> int:
    from ..tools.random_checkpoint import write_random_checkpoint

    if not (args.output or args.output_opt) or (args.output and args.output_opt):
        raise InputError("give one output folder: qtts random-checkpoint OUT (or -o OUT)")
    check_folder(args.output or args.output_opt, "OUT", force=args.force)
    from ..errors import require

    require("torch", "torch", "qtts random-checkpoint")
    t0 = time.perf_counter()
    target = args.output or args.output_opt
    try:
        out = write_random_checkpoint(target, size=args.size, kind=args.kind, layout=args.layout, seed=args.seed,
                                      tokenizer_dir=args.tokenizer, dtype=args.dtype, natural_eos=args.natural_eos,
                                      overwrite=args.force, planted=args.planted)
    except OSError as exc:  # name OUT, not the temporary folder that was removed
        raise OSError(exc.errno, exc.strerror or str(exc), target) from None
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(out) for f in files)
    planted = ", planted structure" if args.planted else ""
    print(f"wrote {args.size} {args.kind} ({args.layout} layout, {args.dtype}, seed {args.seed}{planted}) to {out}: "
          f"{total / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
    if args.kind == "forced_aligner":
        print("random weights: the timestamps follow the audio and the words, but mean nothing")
        return 0
    print("random weights: the audio follows the codes, but it is noise, not speech")
    if not args.tokenizer:
        print(STANDIN_NOTE)
    return 0
