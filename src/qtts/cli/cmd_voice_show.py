"""qtts voice show: print what a .voice file holds."""

from __future__ import annotations

COMMAND = ("voice", "show")
HELP = "show the contents of a .voice file"


def add_arguments(p) -> None:
    p.add_argument("voice", help="a .voice file")


def run(args) -> int:
    from ..voice import Voice

    facts = Voice.load(args.voice).describe()
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        print(f"{key:<{width}}  {value}")
    return 0
