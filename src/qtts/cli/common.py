"""What every ``qtts`` sub-command shares: flag helpers, number checks, output-path checks, progress."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..errors import InputError

THREADS_HELP = ("CPU threads for each component's math (intra-op); more is not faster on tiny checkpoints "
                "(default: picked by qtts from the model size and the cores)")


PLAN_HELP = ("what runs each component: a preset (fast: the default, int8 ONNX; faithful: fp32 ONNX; fastest: "
             "int4 ONNX), built once per checkpoint and cached in $QTTS_CACHE; 'torch': the fp32 reference; "
             "or a plan.json path (default: $QTTS_PLAN, else fast)")
NO_BUILD_HELP = ("fail instead of building a preset's bundle that is not cached yet (also QTTS_NO_BUILD=1); "
                 "build it with qtts cache build")


def cli_plan(args, listeners: tuple = ()):
    """``--plan`` resolved for ``--model`` (a preset's bundle is built now if missing and allowed)."""
    from ..backends import snapshot_dir
    from ..plans.cache import resolve_plan

    no_build = True if getattr(args, "no_build", False) else None
    return resolve_plan(args.plan, snapshot_dir(args.model), getattr(args, "dtype", "float32"),
                        no_build=no_build, listeners=listeners)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) that point at ``--help``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command(sub, name: str, run, help: str) -> Parser:
    """Add sub-command ``name`` running ``run(args) -> int``."""
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(_run=run)
    return p


def group(sub, name: str, help: str):
    """Add a command group (``qtts export ...``); returns its sub-parsers."""
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(_group=p)
    return p.add_subparsers(title="commands", metavar="COMMAND", prog=f"qtts {name}")


def number(cast=int, lo=None, hi=None, above=None):
    """argparse type: a number in [lo, hi] (and > above); argparse names the flag when it fails."""

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if cast is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value:  # NaN fails every bound comparison below, so it would pass them all
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        for bad, rule in ((lo is not None and value < lo, f">= {lo}"), (hi is not None and value > hi, f"<= {hi}"),
                          (above is not None and not value > above, f"> {above}")):
            if bad:
                raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return parse


def hidden_alias(p, *names: str, dest: str, **kw) -> None:
    """An old spelling of a renamed flag: still accepted, not shown in --help."""
    p.add_argument(*names, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kw)


def add_model(p, plan: bool = True, dtype: bool = True, threads: str | None = THREADS_HELP) -> None:
    p.add_argument("-m", "--model", required=True, metavar="MODEL",
                   help="snapshot directory or hub id (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-Base)")
    if plan:
        p.add_argument("--plan", metavar="PLAN", help=PLAN_HELP)
        p.add_argument("--no-build", action="store_true", help=NO_BUILD_HELP)
    if dtype:
        p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="torch weight dtype")
    if threads:
        p.add_argument("--threads", type=number(lo=1), metavar="N", help=threads)


FORCE_HELP = "replace output files that exist (without it, an existing output file is an error)"


def check_file(path: str, flag: str = "-o", suffixes: tuple = (), force: bool | None = None) -> None:
    """Fail before any work when ``path`` cannot be written as a file (``force=False``: or is an
    existing regular file; a device such as /dev/null is written as before)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"{flag} {path}: is a directory; give a file name inside it")
    if force is False and os.path.isfile(path):
        raise InputError(f"{flag} {path}: exists; choose another name or pass --force to replace it")
    if not os.path.isdir(folder):
        raise InputError(f"{flag} {path}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{flag} {path}: folder {folder} is not writable")
    if suffixes and not path.lower().endswith(suffixes):
        raise InputError(f"{flag} {path}: give a path ending in {' or '.join(suffixes)}")


def check_folder(path: str, flag: str = "-o", force: bool | None = None) -> None:
    """Fail before any work when ``path`` cannot become an output folder (``force=False``: must be empty)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{flag} {path}: exists and is not a folder; choose a new folder name")
    if force is False and os.path.isdir(path) and os.listdir(path):
        raise InputError(f"{flag} {path}: folder is not empty; choose a new one or pass --force to overwrite")
    parent = os.path.abspath(path)
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
        raise InputError(f"{flag} {path}: folder {parent} is not writable")


def check_audio(path: str, force: bool | None = None) -> str:
    """Check an audio output path ('-' = raw PCM on stdout; ``force``: as :func:`check_file`); returns the format."""
    from ..audio.writers import format_from_path

    if path == "-":
        if sys.stdout.isatty():
            raise InputError("-o -: raw PCM would go to the terminal; pipe it (qtts say ... -o - | "
                             "aplay -r 24000 -f S16_LE -c 1) or give a file name")
        return "pcm"
    check_file(path, force=force)
    try:
        return format_from_path(path)
    except InputError as exc:
        raise InputError(f"-o {exc}") from None


_CLI_WORDS = (("0b6", "0.6b"), ("1b7", "1.7b"), ("speaker=<", "--speaker <"), ("instruct=...", "--instruct TEXT"),
              ("voice=<Voice or .voice file>", "--voice FILE.voice or --ref-audio CLIP [--ref-text TEXT]"),
              ("instruct=<a description of the voice>", "--instruct TEXT (a description of the voice)"),
              ("plan='", "--plan '"))


def cli_words(message: str) -> str:
    """Library words -> CLI words in messages (model sizes as users spell them, flags for keywords)."""
    for api, cli in _CLI_WORDS:
        message = message.replace(api, cli)
    return message


class Progress:
    """Progress on stderr: one updating line on a terminal, plain lines in a log; then a summary."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def _print(self, line: str, final: bool) -> None:
        if not self.quiet:
            end = "\n" if final or not self.tty else ""
            print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)

    def update(self, chunk) -> None:
        i = chunk.info
        self._print(f"qtts: {i['frames']} frames, {i['frames'] / 12.5:.2f} s audio, {i['wall_s']:.1f} s", False)

    def summary(self, chunk, plan: str | None = None) -> None:
        """The summary line; ``plan``: what ran (a preset name, torch, a plan path)."""
        i = chunk.info
        rtf = f"{i['rtf']:.2f}" if i.get("rtf") is not None else "-"
        ttfa = f"{i['ttfa_s']:.2f}s" if i.get("ttfa_s") is not None else "-"
        reason = f" finish_reason={chunk.finish_reason}" if chunk.finish_reason else ""  # none when decoding
        self._print(f"qtts: frames={i['frames']} audio={i['audio_s']:.2f}s wall={i['wall_s']:.2f}s "
                    f"rtf={rtf} ttfa={ttfa}{reason}{f' plan={plan}' if plan else ''}", True)


class StderrHandler(logging.StreamHandler):
    """A log handler writing to whatever ``sys.stderr`` is when a record is emitted.

    ``logging.StreamHandler()`` keeps the stderr of the moment it was made; when a caller swaps
    ``sys.stderr`` (test capture, an embedding app) and closes the old one, every later record
    (the server's access log from another thread) fails with "I/O operation on closed file".
    """

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property decides
        pass


def add_stderr_handler(logger: logging.Logger, fmt: str, formatter=logging.Formatter) -> None:
    """Give ``logger`` one :class:`StderrHandler` (calling it again, as a second ``run`` in one
    process does, adds no duplicate)."""
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(formatter(fmt))
        logger.addHandler(handler)


#: library loggers whose INFO records are progress a user waits on (a plan build: "building the 'fast'
#: plan", its phases, "built"): the CLI shows them at its default verbosity, as plain lines
PROGRESS_LOGGERS = ("qtts.plans.build",)


class CliFormatter(logging.Formatter):
    """``LEVEL logger: message``; a progress record (INFO from :data:`PROGRESS_LOGGERS`) as its message alone."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO and record.name in PROGRESS_LOGGERS:
            return record.getMessage()
        return super().format(record)


def setup_logging(verbose: int) -> None:
    """The CLI's logging on stderr: warnings (-v: info, -vv: debug) and the progress of a plan build.
    Like ``logging.basicConfig``, it does nothing when the root logger has handlers (an embedding
    app's own set-up wins)."""
    root = logging.getLogger()
    if root.handlers:
        return
    level = logging.WARNING - 10 * min(verbose, 2)
    root.setLevel(level)
    add_stderr_handler(root, "%(levelname)s %(name)s: %(message)s", CliFormatter)
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(min(level, logging.INFO))
