"""Text that arrives in pieces -> the token ids that are already *final*.

``stream()`` tokenizes ``clean_text(text)`` in one go; :class:`FinalTokens` takes the same text
in arbitrary pieces (an LLM's deltas, one character at a time, ...) and hands out each token id
as soon as no continuation can change it, so that the ids handed out, in order, always equal a
prefix of the ids of the whole text (and all of them once :meth:`FinalTokens.finish` is called).

Three stages, each with its own finality rule:

1. **Cleaning** (``clean_text``: NFC, control characters removed, stripped). NFC is not
   prefix-stable ("e" + U+0301 -> "é"), so raw text is cleaned only up to the last *stable
   starter*: a character whose decomposition starts with a canonical-combining-class-0
   character that never composes with a character before it (:func:`stable_starter`; the few
   that do are computed from the Unicode tables). NFC of the text splits there:
   ``NFC(a + b) == NFC(a) + NFC(b)`` when ``b`` starts with a stable starter, and removing
   control characters and the leading whitespace commutes with that split. When the text so
   far ends with a character that also starts no canonical pair (:func:`closed_end`: spaces,
   digits, most punctuation), all of it is cleaned.
2. **Pre-tokenization.** The Qwen2 regex (and the "fixed" variant the official wrapper uses) is
   a left-to-right list of alternatives whose only look-ahead is one character and whose
   repetitions each scan one homogeneous run (letters [+ marks], digits one at a time,
   punctuation [+ newlines or '/'], whitespace). A cut between characters ``x`` and ``y`` of
   the cleaned text is a *hard boundary* (:func:`hard_boundary`) when no alternative that
   starts before ``y`` can consume ``y`` or read past it, whatever follows:

   * a digit on either side (``\\p{N}`` is always a one-character match, and no other
     alternative scans into or out of a digit);
   * ``y`` a letter: only after a newline (the optional one-character prefix of the word
     alternatives takes any other non-letter, e.g. the space of " world" or the "。" of "。今");
   * ``y`` a newline: only after a letter (a punctuation run takes the newlines after it);
   * ``y`` other whitespace: after anything but whitespace (a whitespace run continues);
   * ``y`` punctuation/symbols: after a letter or a newline (" ." and ".." are one run);
   * ``y`` a combining mark: never (it may join the word or the punctuation run before it).

   So "hello " is not final but "hello" is once the space arrives; "hello world" keeps
   " world" until the next boundary; digits are final at once; a run of CJK characters is
   final when the punctuation after it arrives. Matches before a hard boundary depend only on
   the text up to and including ``y``, so they are final once ``y`` is.
3. **BPE** runs per pre-token, so the ids of the pre-tokens before a hard boundary are final.
   They are taken from one ``encode`` of the not-yet-final text (with offsets), which sees the
   same text the whole-text encode sees up to ``y``. A cut never falls inside an added-token
   string ("<|im_end|>", ...) that is or may become complete.

``tests/text/test_incremental.py`` checks the rule with property tests: random splits of a
multilingual corpus, one character at a time, and adversarial pieces, with both regexes.

Cost is linear in the text however it is split: each character is examined for a cut once
(candidate cuts are remembered; only those within an added-token's length of the end are
re-checked), and the raw text's last stable starter is tracked as pieces arrive, so 20,000
one-character pieces cost about 20 times 1,000 of them (``tests/text/test_harden_text.py``).
"""

from __future__ import annotations

import functools
import unicodedata

#: Hangul medial vowels and final consonants compose with the syllable before them
_HANGUL_SECOND = (range(0x1161, 0x1176), range(0x11A8, 0x11C3))
#: Hangul leading consonants and syllables compose with the jamo after them
_HANGUL_FIRST = (range(0x1100, 0x1113), range(0xAC00, 0xD7A4))


@functools.lru_cache(maxsize=1)
def _composing() -> tuple[frozenset, frozenset]:
    """(first, second) halves of the canonical pairs whose second half is a starter (ccc 0), and
    the first halves of every pair: what NFC may join with a following / preceding character."""
    first, second = set(), set()
    for cp in range(0x20000):  # no two-part canonical decomposition lies above U+1FFFF
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = d.split()
            if len(parts) == 2:
                first.add(chr(int(parts[0], 16)))
                if unicodedata.combining(chr(int(parts[1], 16))) == 0:
                    second.add(chr(int(parts[1], 16)))
    for r in _HANGUL_SECOND:
        second.update(chr(c) for c in r)
    for r in _HANGUL_FIRST:
        first.update(chr(c) for c in r)
    return frozenset(first), frozenset(second)


def stable_starter(ch: str) -> bool:
    """True when NFC never joins ``ch`` with what comes before it (a safe place to cut)."""
    if ch.isascii():
        return True
    first = unicodedata.normalize("NFD", ch)[0]
    return unicodedata.combining(first) == 0 and first not in _composing()[1]


def closed_end(ch: str) -> bool:
    """True when NFC never joins ``ch`` with what comes after it either (a stable starter that
    starts no canonical pair: a space, a digit, most punctuation; not a letter that takes accents)."""
    if not stable_starter(ch):
        return False
    last = unicodedata.normalize("NFD", ch)[-1]
    return unicodedata.combining(last) == 0 and last not in _composing()[0]


def _removed(ch: str) -> bool:
    """Characters ``clean_text`` drops: control characters except newline/tab, surrogates."""
    return ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cs")


def _clean(raw: str) -> str:
    """``clean_text`` without the strip (and without its errors)."""
    text = unicodedata.normalize("NFC", raw)
    return unicodedata.normalize("NFC", "".join(ch for ch in text if not _removed(ch)))


def _kind(ch: str) -> str:
    if ch == "\n" or ch == "\r":
        return "nl"
    if ch.isspace():
        return "ws"
    cat = unicodedata.category(ch)[0]
    return {"L": "letter", "N": "digit", "M": "mark"}.get(cat, "punct")


def hard_boundary(x: str, y: str) -> bool:
    """True when no pre-tokenizer match can cross the cut between ``x`` and ``y`` (module doc)."""
    kx, ky = _kind(x), _kind(y)
    if "digit" in (kx, ky):
        return True
    if ky == "mark":
        return False
    if ky == "letter":
        return kx == "nl"
    if ky == "nl":
        return kx == "letter"
    if ky == "ws":
        return kx not in ("ws", "nl")
    return kx in ("letter", "nl")  # punctuation / symbols


def _added_strings(tokenizer) -> tuple[str, ...]:
    inner = getattr(tokenizer, "tokenizer", None)
    decoder = getattr(inner, "get_added_tokens_decoder", None)
    if decoder is None:
        return ()
    return tuple(t.content for t in decoder().values() if t.content)


class FinalTokens:
    """Incremental ``clean_text`` + tokenization (module docstring); single-threaded.

    ``push(piece)`` appends raw text and returns the ids that became final; ``finish()``
    returns the rest. ``text`` is the cleaned final text so far and ``starts`` the character
    offset (in ``text``) where each handed-out token starts. ``restart(offset)`` begins a new
    tokenization at ``offset`` (leading whitespace dropped, as ``clean_text`` does for a new
    sentence piece) and returns the ids final from there.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.added = _added_strings(tokenizer)
        self.raw = ""  # raw text not cleaned yet (after the last stable starter)
        self.text = ""  # cleaned, final text (a prefix of clean_text(whole) up to whitespace)
        self.cursor = 0  # text[cursor:] is not tokenized into final ids yet
        self.starts: list[int] = []  # text offset of each final id of the current run
        self.ids: list[int] = []  # final ids of the current run (since the last restart)
        self.finished = False
        self.run_start = 0  # text offset where the current run starts (after its leading whitespace)
        self._lead = True  # still inside the leading whitespace of the current run
        self._added_max = max((len(s) for s in self.added), default=0)
        self._raw_stable = 0  # index of the last stable starter in raw (0 = none after raw[0])
        self._scanned = 0  # text offsets below this were examined for a cut
        self._best = 0  # the last settled cut (its added-token check can no longer change)
        self._open: list[int] = []  # cuts within an added-token's length of the end: re-checked

    # -- input -------------------------------------------------------------------------------
    def push(self, piece: str) -> list[int]:
        if self.finished:
            raise ValueError("text pushed after finish()")
        if not piece:
            return []
        if self.raw and "\ud800" <= self.raw[-1] <= "\udbff" and "\udc00" <= piece[0] <= "\udfff":
            pair = (self.raw[-1] + piece[0]).encode("utf-16", "surrogatepass").decode("utf-16")
            self.raw, piece = self.raw[:-1] + pair, piece[1:]  # a surrogate pair split across pieces
        first = max(1, len(self.raw) - 1)
        self.raw += piece
        cut = self._raw_cut(first)
        if cut > 0:
            self._append(_clean(self.raw[:cut]))
            self.raw = self.raw[cut:]
            self._raw_stable = 0  # the kept tail has none after its first character
        return self._take(final=False)

    def finish(self) -> list[int]:
        """End of input: everything left is final (trailing whitespace dropped)."""
        if self.finished:
            return []
        self._append(_clean(self.raw))
        self.raw = ""
        self.text = self.text.rstrip()
        self.cursor = min(self.cursor, len(self.text))
        self.finished = True
        return self._take(final=True)

    def restart(self, offset: int) -> list[int]:
        """Start a new run of ids at ``text`` offset ``offset`` (a hard boundary); returns its final ids."""
        self.cursor = offset
        self.ids, self.starts = [], []
        self._lead = True
        self._scanned, self._best, self._open = 0, 0, []  # cuts are looked for again from the offset
        self._skip_lead()
        return self._take(final=self.finished)

    # -- internals ---------------------------------------------------------------------------
    def _raw_cut(self, first: int) -> int:
        """Where ``raw`` can be cleaned up to: its end when its last character joins nothing that
        follows, else the last stable starter that cleaning keeps (0 = none). ``raw[first:]`` is
        new since the last call: only it is scanned."""
        raw = self.raw
        for i in range(first, len(raw)):
            if not _removed(raw[i]) and stable_starter(raw[i]):
                self._raw_stable = i
        if raw and not _removed(raw[-1]) and closed_end(raw[-1]):
            return len(raw)
        return self._raw_stable

    def _append(self, cleaned: str) -> None:
        self.text += cleaned
        self._skip_lead()

    def _skip_lead(self) -> None:
        if self._lead:
            while self.cursor < len(self.text) and self.text[self.cursor].isspace():
                self.cursor += 1
            self.run_start = self.cursor
            self._lead = self.cursor >= len(self.text)

    def _cut(self) -> int:
        """The last hard boundary in ``text`` after ``cursor`` (0 = none).

        Each offset is examined once. A cut that no added-token string spans stays so as text
        arrives (more text can only rule a partial added token out), so the latest such cut is
        kept and the earlier ones dropped; a spanned cut is checked again only while it lies
        within ``_added_max`` characters of the end."""
        t, cursor = self.text, self.cursor
        for c in range(max(self._scanned, cursor + 1), len(t)):
            if hard_boundary(t[c - 1], t[c]) and stable_starter(t[c]):
                self._open.append(c)
        self._scanned = max(self._scanned, len(t))
        keep = []
        for c in reversed(self._open):
            if c <= cursor or c <= self._best:
                break
            if not self._inside_added(c):
                self._best = c
                break
            if c + self._added_max > len(t):
                keep.append(c)  # spanned by an added-token prefix that later text may rule out
        self._open = keep[::-1]
        return self._best if self._best > cursor else 0

    def _inside_added(self, c: int) -> bool:
        """True when an added-token string (complete, or a prefix at the end) spans offset ``c``."""
        t = self.text
        for s in self.added:
            for k in range(1, len(s)):
                if t.endswith(s[:k], 0, c) and s[k:].startswith(t[c : c + len(s) - k]):
                    return True
        return False

    def _take(self, final: bool) -> list[int]:
        if self._lead and not final:
            return []
        end = len(self.text) if final else self._cut()
        if end <= self.cursor:
            return []
        ids, starts = self.tokenizer.encode_offsets(self.text[self.cursor :])
        limit = end - self.cursor
        new = [(i, self.cursor + s) for i, s in zip(ids, starts) if s < limit]
        self.cursor = end
        self.ids += [i for i, _ in new]
        self.starts += [s for _, s in new]
        return [i for i, _ in new]
