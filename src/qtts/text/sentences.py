"""Sentence splitting for long text (every model language, CJK punctuation included).

:func:`split_sentences` cuts a text into pieces of at most ``max_chars`` at sentence ends (then at
clause ends, then hard); :func:`pack_sentences` packs its whole sentences into pieces of up to
``max_chars`` (what ``TTS.stream`` speaks, one talker context each); :func:`sentence_end` finds the first sentence end in a span (live text:
:mod:`qtts.text.incremental`). Rules and examples: docs/text.md.
"""

from __future__ import annotations

import re
import unicodedata

_CLOSERS = "\"'”’»」』》】）)]"
# CJK / full-width terminators end a sentence anywhere; ASCII ones only before a space or the end.
_SENTENCE_END = re.compile(
    rf"[。！？；．｡‼⁇⁈⁉]+[{re.escape(_CLOSERS)}]*|[.!?…]+[{re.escape(_CLOSERS)}]*(?=\s|$)"
)
_CLAUSE_END = re.compile(r"[,，、;；:：—–]+|\s-\s")
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "z.b", "bzw",
    "usw", "nr", "no", "sra", "srta", "dra", "ca", "approx", "fig", "vol",
}


def _is_abbreviation(text: str, end: int) -> bool:
    """True when the single '.' ending at ``end`` belongs to an abbreviation or an initial."""
    if text[end - 1] != "." or (end >= 2 and text[end - 2] in ".!?…"):
        return False
    word = re.search(r"[\w.]*$", text[: end - 1]).group(0).lower()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    """Spans of sentences: ends after terminators (plus closing quotes) and at line breaks."""
    cuts = {0, len(text)}
    for m in re.finditer(r"\n+", text):
        cuts.add(m.end())
    for m in _SENTENCE_END.finditer(text):
        if not _is_abbreviation(text, m.end()):
            cuts.add(m.end())
    edges = sorted(cuts)
    return [(a, b) for a, b in zip(edges, edges[1:]) if text[a:b].strip()]


def sentence_end(text: str, lo: int, hi: int) -> int | None:
    """The first sentence end ``e`` with ``lo <= e < hi`` (``hi < len(text)``) by the rules of
    :func:`split_sentences`. It reads only ``text[:hi + 1]``, so for a text that is still growing
    the answer is already final."""
    start = max(0, lo - 64)  # a terminator run and an abbreviation look back a little
    ends = [start + m.end() for m in re.finditer(r"\n+", text[start : hi + 1])]
    ends += [m.end() for m in _SENTENCE_END.finditer(text, start, hi + 1) if not _is_abbreviation(text, m.end())]
    ends = [e for e in ends if lo <= e < hi]
    return min(ends) if ends else None


def _joined(text: str, i: int) -> bool:
    """True when a cut between text[i-1] and text[i] would split one user-perceived character."""
    ch, prev = text[i], text[i - 1]
    if unicodedata.category(ch) in ("Mn", "Me", "Mc") or "\u200d" in (ch, prev):
        return True
    if "\ufe00" <= ch <= "\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff":  # variation selector, skin tone
        return True
    regional = "\U0001f1e6" <= ch <= "\U0001f1ff" and "\U0001f1e6" <= prev <= "\U0001f1ff"
    return regional and (len(re.search("[\U0001f1e6-\U0001f1ff]*$", text[:i]).group(0)) % 2 == 1)


def _hard_cut(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Cut [start, end) into spans <= max_chars: at clause marks, else spaces, else anywhere."""
    spans = []
    while end - start > max_chars:
        limit = start + max_chars
        window = text[start:limit]
        cut = max((m.end() for m in _CLAUSE_END.finditer(window)), default=0)
        if cut == 0:
            cut = max((m.start() + 1 for m in re.finditer(r"\s", window)), default=0)
        if cut == 0:
            cut = max_chars
            while cut > 1 and _joined(text, start + cut):
                cut -= 1  # never split a character from its marks, or an emoji sequence
        spans.append((start, start + cut))
        start += cut
    spans.append((start, end))
    return spans


def split_sentences(text: str, max_chars: int = 200, min_chars: int = 12) -> list[str]:
    """Split ``text`` into stripped pieces of at most ``max_chars`` characters.

    Cuts after sentence terminators (ASCII . ! ? … before a space; CJK 。！？；．anywhere;
    closing quotes stay with their sentence) and at line breaks; abbreviations such as "Dr."
    and initials are not cut. Pieces shorter than ``min_chars`` are merged into a neighbour
    (while the result fits ``max_chars``); longer pieces are cut at commas/colons/dashes,
    then spaces, then anywhere. No text is dropped: the pieces, joined, equal ``text``
    without the whitespace at the cut points.
    """
    if max_chars < 8:
        raise ValueError(f"max_chars must be >= 8, got {max_chars}")
    spans: list[tuple[int, int]] = []
    for a, b in _sentence_spans(text):
        spans.extend(_hard_cut(text, a, b, max_chars))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged:
            pa, pb = merged[-1]
            small = len(text[pa:pb].strip()) < min_chars or len(text[a:b].strip()) < min_chars
            if small and len(text[pa:b].strip()) <= max_chars:
                merged[-1] = (pa, b)
                continue
        merged.append((a, b))
    return [p for p in (text[a:b].strip() for a, b in merged) if p]


def pack_sentences(text: str, max_chars: int = 200) -> list[str]:
    """Whole sentences packed greedily into pieces of at most ``max_chars`` (:func:`split_sentences`'
    cuts, every piece merged with the next while the two fit): a text of at most ``max_chars`` is
    one piece; a sentence longer than that is cut as :func:`split_sentences` cuts it."""
    return split_sentences(text, max_chars=max_chars, min_chars=max_chars + 1)
