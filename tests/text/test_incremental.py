"""Incremental token finality (qtts.text.incremental): ids handed out for text that arrives in pieces are
always a prefix of the whole text's prompt body ids, and all of them at the end.

Property tests over the tokenizer corpus (10 languages, digits, emoji, NFD, controls, special-token
strings) with both pre-tokenizer regexes, random splits, one character at a time, and hypothesis
strings from an adversarial alphabet.
"""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REAL_TOKENIZER_DIR
from qtts.errors import InputError
from qtts.text.incremental import FinalTokens, hard_boundary, stable_starter
from qtts.text.prompt import Mode, _tokenize, clean_text
from qtts.text.sentences import sentence_end
from qtts.text.tokenizer import TextTokenizer
from support.corpus import corpus


@pytest.fixture(scope="module", params=["fixed", "qwen2"])
def tok(request):
    return TextTokenizer.from_dir(REAL_TOKENIZER_DIR, regex=request.param)


def whole_ids(tok, text: str) -> list[int]:
    """The prompt body of the whole text, exactly as build_prompt slices it."""
    try:
        cleaned = clean_text(text)
    except InputError:  # nothing visible: refused as empty (speakable), yet the tokenizer still sees the text
        nfc = unicodedata.normalize("NFC", text)
        cleaned = "".join(ch for ch in nfc if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs")).strip()
        if not cleaned:
            return []
    return list(_tokenize(tok, cleaned, Mode("xvector"), None)[1])


def feed(tok, pieces, whole: list[int]) -> list[list[int]]:
    """Push ``pieces``; after each, the ids so far must be a prefix of ``whole``. Returns the steps."""
    ft, got, steps = FinalTokens(tok), [], []
    for i, piece in enumerate(pieces):
        got += ft.push(piece)
        assert got == whole[: len(got)], (pieces[: i + 1], got, whole)
        steps.append(list(got))
    got += ft.finish()
    assert got == whole, (pieces, got, whole)
    return steps


def random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
    edges = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:])]


def test_corpus_random_splits(tok):
    rng = random.Random(13)
    for line in corpus():
        whole = whole_ids(tok, line)
        feed(tok, [line], whole)
        feed(tok, list(line), whole)  # one character at a time
        for _ in range(6):
            feed(tok, random_split(line, rng), whole)


def test_corpus_whole_words(tok):
    """LLM-like deltas: words with their leading space."""
    for line in corpus()[::2]:
        words = [w for w in __import__("re").split(r"(?=\s)", line) if w]
        feed(tok, words, whole_ids(tok, line))


ALPHABET = list("aZé ss\n\t.,!?'’-/0129") + [
    "\u0301", "\u0323", "e\u0301", "\u3002", "\uff0c", "你", "好", "日本", "한", "\u1100", "\u1161", "\u11a8",
    "\u0915", "\u093f", "\u0b47", "\u0b3e", "\u00a0", "\u3000", "\u200d", "\U0001f600", "\U0001f3fd", "ǅ", "ʰ",
    "<|im_end|>", "<|im_", "end|>", "<tts_pad>", "\x00", "\r", "\x85", "\ufeff", "Ⅻ", "²", "'s", "'LL", "  ",
]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parts=st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=30), data=st.data())
def test_adversarial_pieces(parts, data):
    tok = _tokenizers()[data.draw(st.sampled_from([0, 1]))]
    text = "".join(parts)
    whole = whole_ids(tok, text)
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    feed(tok, random_split(text, rng), whole)
    feed(tok, parts, whole)


_TOKS: list = []


def _tokenizers():
    if not _TOKS:
        _TOKS.extend(TextTokenizer.from_dir(REAL_TOKENIZER_DIR, regex=r) for r in ("fixed", "qwen2"))
    return _TOKS


def test_surrogate_pair_split_across_pieces(tok):
    """JSON clients may send an emoji as two escaped surrogate halves in two messages."""
    text = "smile \U0001f600 please"
    hi, lo = "\ud83d", "\ude00"
    assert (hi + lo).encode("utf-16", "surrogatepass").decode("utf-16") == "\U0001f600"
    feed(tok, ["smile ", hi, lo + " please"], whole_ids(tok, text))
    feed(tok, ["smile " + hi, lo, " please"], whole_ids(tok, text))


def test_what_is_final_when(tok):
    """The rule in words: a word is final at the next boundary, the space before a word joins it,
    a digit is final as soon as anything follows it, a CJK run at its punctuation."""
    ft = FinalTokens(tok)
    assert ft.push("Hello") == []  # "Hello" + "s" would be another word
    assert ft.push(" ") == tok.encode("Hello")
    assert ft.push("world") == []  # " world" is one token, still growing
    assert ft.push(",") == tok.encode(" world")
    assert ft.push(" 4") == tok.encode(",") + tok.encode(" ")  # the space before a digit is its own token
    assert ft.push("2") == tok.encode("4")
    assert ft.finish() == tok.encode("2")
    cjk = FinalTokens(tok)
    assert cjk.push("你好世界") == []
    assert cjk.push("，") == tok.encode("你好世界")  # final at its punctuation
    assert cjk.push("我们") == []  # "，我们" is one pre-token: it stays open until the next boundary
    assert FinalTokens(tok).push("e\u0301 ") == tok.encode("\u00e9")  # NFC across the pieces


def test_hard_boundary_table():
    assert hard_boundary("o", " ") and hard_boundary(".", " ") and hard_boundary("\n", "W")
    assert hard_boundary("a", "1") and hard_boundary("1", "a") and hard_boundary(" ", "1")
    assert not hard_boundary(" ", "w") and not hard_boundary(".", "w") and not hard_boundary(" ", " ")
    assert not hard_boundary(".", "\n") and not hard_boundary("e", "\u0301") and not hard_boundary(" ", ".")
    assert hard_boundary("o", "\n") and hard_boundary("o", ".") and not hard_boundary("o", "p")


def test_stable_starters():
    assert stable_starter("a") and stable_starter(" ") and stable_starter("你")
    assert not stable_starter("\u0301")  # combining acute
    assert not stable_starter("\u1161")  # Hangul vowel joins the syllable before it
    assert not stable_starter("\u0b3e")  # Oriya vowel sign AA composes backward
    for ch in ("e\u0301", "\u1100\u1161", "\u0b47\u0b3e"):
        assert unicodedata.normalize("NFC", ch) != ch  # these pairs do compose


def test_restart_drops_leading_space(tok):
    """A new run (a new talker context) tokenizes its text like a new sentence piece."""
    ft = FinalTokens(tok)
    ft.push("One. Two three ")
    assert ft.ids == tok.encode("One. Two three")
    assert ft.restart(ft.text.index(" Two")) == tok.encode("Two three")
    assert ft.run_start == ft.text.index("Two")
    ft.push("four")
    ft.finish()
    assert ft.ids == tok.encode("Two three four")


def test_sentence_end_is_final_as_text_grows():
    text = "Hi there. Next one! Dr. Who? 你好。今天\nok"
    full = [sentence_end(text, 0, hi) for hi in range(1, len(text))]
    for n in range(2, len(text) + 1):  # only text[:hi + 1] is read
        prefix = text[:n]
        assert [sentence_end(prefix, 0, hi) for hi in range(1, n - 1)] == full[: n - 2]
    assert sentence_end(text, 0, len(text) - 1) == text.index(".") + 1
    assert sentence_end(text, text.index("Dr"), len(text) - 1) == text.index("?") + 1  # "Dr." is no end
