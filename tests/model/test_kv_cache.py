"""KV-cache invariants of our talker and code predictor (ours vs ours, tiny snapshot, fp32).

Prefill + N single steps (and mixed chunk sizes) through the static cache equal one full forward.
"""

from __future__ import annotations

import pytest
import torch

from qtts.weights import load_checkpoint


@pytest.fixture(scope="module")
def talker(tiny_snapshot):
    return load_checkpoint(tiny_snapshot(kind="base", layout="1.7b"), components=("talker",)).model.talker


def _close(a, b, what):
    err = (a - b).abs().max().item()
    assert err <= 1e-5 * b.abs().max().item(), f"{what}: max abs err {err:.3e}"


@torch.no_grad()
@pytest.mark.parametrize("chunks", [[10, 1, 1, 1, 1, 1, 1, 1, 1], [4, 3, 1, 5, 2]])
def test_talker_chunks_equal_full_forward(talker, chunks):
    n = sum(chunks)
    embeds = torch.randn(1, n, talker.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    full_logits, full_hidden, _ = talker(embeds, 0, talker.new_cache(n))
    cache, pos = talker.new_cache(n + 7), 0  # a larger cache than needed: unused slots must not matter
    for t in chunks:
        logits, hidden, cache = talker(embeds[:, pos : pos + t], pos, cache)
        _close(logits, full_logits[:, pos : pos + t], f"logits at {pos}")
        _close(hidden, full_hidden[:, pos : pos + t], f"hidden at {pos}")
        pos += t


@torch.no_grad()
def test_predictor_frame_equals_full_forward(talker):
    cp = talker.code_predictor
    embeds = torch.randn(1, 16, talker.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    full, _ = cp(embeds, 0, cp.new_cache())
    cache = cp.new_cache()
    out, cache = cp(embeds[:, :2], 0, cache)
    _close(out, full[:, :2], "prefill")
    for pos in range(2, 16):
        out, cache = cp(embeds[:, pos : pos + 1], pos, cache)
        _close(out, full[:, pos : pos + 1], f"step at {pos}")


@torch.no_grad()
def test_predictor_cache_reuse_after_reset(talker):
    """A frame on a dirty cache (previous frame's slots left in place) equals a frame on a fresh cache."""
    cp = talker.code_predictor
    g = torch.Generator().manual_seed(2)
    a, b = (torch.randn(1, 16, talker.cfg.hidden_size, generator=g) for _ in range(2))
    cache = cp.new_cache()
    cp(a, 0, cache)
    dirty, _ = cp(b[:, :2], 0, cache)
    clean, _ = cp(b[:, :2], 0, cp.new_cache())
    _close(dirty, clean, "prefill on a reused cache")


@torch.no_grad()
def test_batch_rows_are_independent(talker):
    g = torch.Generator().manual_seed(3)
    embeds = torch.randn(2, 6, talker.cfg.hidden_size, generator=g)
    both, _, _ = talker(embeds, 0, talker.new_cache(6, batch=2))
    one, _, _ = talker(embeds[1:], 0, talker.new_cache(6))
    _close(both[1:], one, "batch row 1")


def test_cache_overflow_is_an_error(talker):
    with pytest.raises(ValueError, match="do not fit"):
        talker(torch.zeros(1, 3, talker.cfg.hidden_size), 2, talker.new_cache(4))
