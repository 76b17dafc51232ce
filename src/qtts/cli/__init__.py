"""The ``qtts`` command line.

Sub-commands live in modules ``qtts/cli/cmd_*.py``; each defines

* ``COMMAND``: a tuple, ``("say",)`` or ``("export", "vocoder")`` for a grouped command;
* ``HELP``: one line for ``qtts --help``;
* ``add_arguments(parser)`` and ``run(args) -> int``.

They are discovered automatically, so adding a command never edits this file. Exit codes:
0 success, 2 usage/input errors (:class:`~qtts.errors.InputError`), 1 runtime failures.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from ..errors import InputError, QttsError

log = logging.getLogger("qtts")


def _command_modules():
    pkg = sys.modules[__name__]
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("cmd_"):
            yield importlib.import_module(f"{__name__}.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="qtts",
        description="qtts: fast, streaming, verifiable Qwen3-TTS inference and edge export.",
    )
    parser.add_argument("--version", action="version", version=f"qtts {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for mod in _command_modules():
        name = mod.COMMAND
        if len(name) == 1:
            p = sub.add_parser(name[0], help=mod.HELP, description=mod.HELP)
        else:
            if name[0] not in groups:
                gp = sub.add_parser(name[0], help=f"{name[0]} commands")
                groups[name[0]] = gp.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
                gp.set_defaults(_group_parser=gp)
            p = groups[name[0]].add_parser(name[1], help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    run = getattr(args, "_run", None)
    if run is None:
        group = getattr(args, "_group_parser", None)
        (group or parser).print_help(sys.stderr)
        return 2
    try:
        return int(run(args) or 0)
    except InputError as exc:
        print(f"qtts: error: {exc}", file=sys.stderr)
        return 2
    except QttsError as exc:
        print(f"qtts: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("qtts: interrupted", file=sys.stderr)
        return 130
