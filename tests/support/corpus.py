"""The multilingual tokenizer corpus (tests/data/tokenizer_corpus.txt), one text per line with escapes."""

from __future__ import annotations

import re
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "data" / "tokenizer_corpus.txt"

_ESCAPE = re.compile(r"\\(n|r|t|\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def _unescape(line: str) -> str:
    def sub(m):
        s = m.group(1)
        return {"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}.get(s) or chr(int(s[1:], 16))

    return _ESCAPE.sub(sub, line)


def corpus() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").split("\n")
    return [_unescape(x) for x in lines if x and not x.startswith("# ")]
