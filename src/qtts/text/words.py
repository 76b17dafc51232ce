"""Word split of the forced aligner: the units that get timestamps, per language.

The same rules as the official ``Qwen3ForceAlignProcessor`` (qwen-asr 0.0.6), written anew:

* a word keeps only letters, digits (Unicode categories L* and N*) and the apostrophe;
  everything else (punctuation, symbols, marks) is dropped, and a word left empty disappears;
* **Japanese**: the morphemes of nagisa 0.2.11 (``nagisa.tagging(text).words``), cleaned;
* **Korean**: soynlp 0.0.493's ``LTokenizer`` scored with the official Korean word list
  (``qtts/data/aligner/korean_words.txt``, every word scored 1.0), cleaned;
* **every other language**: split on whitespace, clean each piece, then every CJK ideograph
  becomes a word of its own and the runs between them stay whole ("你好world" -> 你, 好, world).

nagisa and soynlp are heavy (a neural tagger, scikit-learn), so they are the optional extra
``align-cjk``; without it Japanese and Korean raise :class:`~qtts.errors.MissingDependencyError`
naming the extra. Language names are matched case-insensitively ("Japanese", "japanese").
"""

from __future__ import annotations

import functools
import os
import unicodedata

from ..errors import MissingDependencyError

#: CJK ideograph blocks that become one word per character (Unified, Ext. A-E, Compatibility)
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
)
_KOREAN_WORDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "aligner",
                             "korean_words.txt")  # fmt: skip


def is_kept(ch: str) -> bool:
    """Letters, digits and the apostrophe survive in a word."""
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


def clean(word: str) -> str:
    return "".join(ch for ch in word if is_kept(ch))


def is_cjk(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in CJK_RANGES)


def _split_cjk(piece: str) -> list[str]:
    """Each CJK ideograph alone, the runs between them whole."""
    out, run = [], ""
    for ch in piece:
        if is_cjk(ch):
            if run:
                out.append(run)
            out.append(ch)
            run = ""
        else:
            run += ch
    return out + ([run] if run else [])


def split_spaced(text: str) -> list[str]:
    """The rule for every language but Japanese and Korean."""
    words: list[str] = []
    for piece in text.split():
        kept = clean(piece)
        if kept:
            words.extend(_split_cjk(kept))
    return words


def _require(module: str, language: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{language} word timestamps split words with '{module}', which is not installed; install the "
            "aligner's Japanese/Korean splitters with: pip install -e \".[align-cjk]\" (in the qtts checkout)"
        ) from exc


def split_japanese(text: str) -> list[str]:
    nagisa = _require("nagisa", "Japanese")
    return [w for w in (clean(m) for m in nagisa.tagging(text).words) if w]


@functools.lru_cache(maxsize=1)
def _korean_tokenizer():
    tokenizer = _require("soynlp.tokenizer", "Korean")
    with open(_KOREAN_WORDS, encoding="utf-8") as fh:
        scores = {line.strip(): 1.0 for line in fh if line.strip()}
    return tokenizer.LTokenizer(scores=scores)


def split_korean(text: str) -> list[str]:
    return [w for w in (clean(t) for t in _korean_tokenizer().tokenize(text)) if w]


def split_words(text: str, language: str) -> list[str]:
    """The words of ``text`` that the aligner times, for ``language`` (e.g. "English", "Chinese")."""
    lang = (language or "").strip().lower()
    if lang == "japanese":
        return split_japanese(text)
    if lang == "korean":
        return split_korean(text)
    return split_spaced(text)
