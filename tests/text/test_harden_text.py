"""Incremental tokenization costs time linear in the text, however it is split (issue: 20,000
one-letter deltas took 83 s of CPU, quadratic). Measured as a ratio in one test: the cost per
piece of 20,000 one-character pieces against 1,000 of them, never as a wall-clock bound."""

from __future__ import annotations

import time

import pytest

from conftest import REAL_TOKENIZER_DIR
from qtts.text.incremental import FinalTokens
from qtts.text.live import TextFeed
from qtts.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer.from_dir(REAL_TOKENIZER_DIR, regex="fixed")


def _cost(tok, pieces: list[str], feed: bool) -> float:
    """CPU seconds to push ``pieces`` (the best of three runs, to shed noise of a shared machine)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        if feed:
            f = TextFeed(tok)
            for p in pieces:
                f.push(p)
            f.close()
        else:
            ft = FinalTokens(tok)
            for p in pieces:
                ft.push(p)
            ft.finish()
        best = min(best, time.process_time() - t0)
    return best


@pytest.mark.parametrize("unit", ["a", "\u0301", "<|im_end|", "ab.", "é"])
@pytest.mark.parametrize("feed", [False, True], ids=["tokens", "feed"])
def test_one_character_pieces_cost_linear_time(tok, unit, feed):
    small = list(("a" + unit * 1000)[:1000]) if len(unit) > 1 else ["a"] + [unit] * 999
    big = list(("a" + unit * 20000)[:20000]) if len(unit) > 1 else ["a"] + [unit] * 19999
    per_small = _cost(tok, small, feed) / len(small)
    per_big = _cost(tok, big, feed) / len(big)
    # linear: the same cost per piece; quadratic (before): 20 times as much per piece
    assert per_big <= 4 * max(per_small, 2e-6), (unit, per_small, per_big)


def test_ids_still_match_the_whole_text(tok):
    text = "Hello <|im_end|> wörld. 42 cats; e\u0301 " * 30
    ft, got = FinalTokens(tok), []
    for ch in text:
        got += ft.push(ch)
    got += ft.finish()
    whole = FinalTokens(tok)
    assert got == whole.push(text) + whole.finish()
