"""Parity of our talker and code predictor with the official qwen-tts classes (fp32, tiny snapshots).

Both layouts: 0.6b (talker width == predictor width) and 1.7b (talker wider, so the code
predictor applies ``small_to_mtp_projection``). Tolerance: max abs error <= 1e-4 * max |ref|.
"""

from __future__ import annotations

import pytest
import torch

from qtts.weights import load_checkpoint

pytestmark = pytest.mark.parity
LAYOUTS = ["0.6b", "1.7b"]
PREFILL, STEPS = 12, 8


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
    err = (ours.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert scale > 0, f"{what}: reference is all zeros"
    assert err <= 1e-4 * scale, f"{what}: max abs err {err:.3e} > 1e-4 * {scale:.3e}"


@pytest.fixture(scope="module")
def pair(tiny_snapshot, official_tts):
    """(ours: Talker, ref: official Qwen3TTSTalkerForConditionalGeneration) per layout."""
    cache = {}

    def get(layout: str):
        if layout not in cache:
            path = tiny_snapshot(kind="base", layout=layout)
            ours = load_checkpoint(path, components=("talker",)).model.talker
            cache[layout] = (ours, official_tts(path).model.talker)
        return cache[layout]

    return get


def _talker_inputs(talker, n: int, seed: int) -> torch.Tensor:
    """Realistic talker inputs: projected text embedding + codec embedding per position."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, 151936, (1, n), generator=g)
    codec = torch.randint(0, 3072, (1, n), generator=g)
    return talker.embed_text(text) + talker.embed_codec(codec)


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_embeddings_match(pair, layout):
    ours, ref = pair(layout)
    ids = torch.tensor([[0, 17, 151643, 151671, 151935]])
    assert_close(ours.embed_text(ids), ref.text_projection(ref.get_text_embeddings()(ids)), "text embedding")
    codes = torch.tensor([[0, 2047, 2148, 3071]])
    assert_close(ours.embed_codec(codes), ref.get_input_embeddings()(codes), "codec embedding")
    for j in (0, 7, 14):
        assert_close(
            ours.code_predictor.embed(j, codes[:, :2]),
            ref.code_predictor.get_input_embeddings()[j](codes[:, :2]),
            f"predictor embedding {j}",
        )


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_talker_prefill_logits_and_hidden(pair, layout):
    ours, ref = pair(layout)
    embeds = _talker_inputs(ours, PREFILL, seed=1)
    logits, hidden, _ = ours(embeds, 0, ours.new_cache(64))
    ref_out = ref(inputs_embeds=embeds, use_cache=False)
    ref_hidden = ref.model(inputs_embeds=embeds, use_cache=False).last_hidden_state
    assert_close(logits, ref_out.logits, "prefill logits")
    assert_close(hidden, ref_hidden, "prefill hidden (after final norm)")
    assert_close(hidden[:, -1:], ref_out.past_hidden, "last hidden handed to the code predictor")


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_talker_decode_steps_with_kv_cache(pair, layout):
    ours, ref = pair(layout)
    embeds = _talker_inputs(ours, PREFILL + STEPS, seed=2)
    cache = ours.new_cache(PREFILL + STEPS + 3)
    _, _, cache = ours(embeds[:, :PREFILL], 0, cache)
    ref_logits = ref(inputs_embeds=embeds, use_cache=False).logits  # one full forward
    ref_hidden = ref.model(inputs_embeds=embeds, use_cache=False).last_hidden_state
    for step in range(STEPS):
        pos = PREFILL + step
        logits, hidden, cache = ours(embeds[:, pos : pos + 1], pos, cache)
        assert_close(logits, ref_logits[:, pos : pos + 1], f"decode step {step} logits")
        assert_close(hidden, ref_hidden[:, pos : pos + 1], f"decode step {step} hidden")


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_code_predictor_all_15_steps(pair, layout):
    """Prefill [talker hidden, codec_embedding(code0)] then 14 single-code steps, vs the official cached forward."""
    ours, ref = pair(layout)
    g = torch.Generator().manual_seed(3)
    _, hidden, _ = ours(_talker_inputs(ours, 5, seed=4), 0, ours.new_cache(8))
    h = hidden[:, -1:]
    codes = torch.randint(0, 2048, (1, 16), generator=g)
    prefill = torch.cat([h, ours.embed_codec(codes[:, :1])], dim=1)

    cp = ours.code_predictor
    cache = cp.new_cache()
    out, cache = cp(prefill, 0, cache)
    ref_out = ref.code_predictor(inputs_embeds=prefill, use_cache=True)
    assert_close(cp.head(0, out[:, -1:]), ref_out.logits[:, -1:], "predictor step 0 (code 1) logits")
    past, steps = ref_out.past_key_values, ref_out.generation_steps
    for j in range(1, 15):
        code = codes[:, j : j + 1]
        out, cache = cp(cp.embed(j - 1, code), j + 1, cache)
        ref_out = ref.code_predictor(
            input_ids=code, past_key_values=past, generation_steps=steps, use_cache=True
        )
        past, steps = ref_out.past_key_values, ref_out.generation_steps
        assert_close(cp.head(j, out), ref_out.logits, f"predictor step {j} (code {j + 1}) logits")


def _talker_then_predictor(ours, ref, close, steps, seed, code0, code_step, what):
    """Talker prefill + ``steps`` KV-cached decode steps, then a predictor frame fed ``code0`` and
    codes ``code_step * j``: every logits tensor checked against the official modules by ``close``."""
    embeds = _talker_inputs(ours, PREFILL + steps, seed=seed)
    ref_logits = ref(inputs_embeds=embeds, use_cache=False).logits
    cache = ours.new_cache(PREFILL + steps)
    logits, hidden, cache = ours(embeds[:, :PREFILL], 0, cache)
    close(logits, ref_logits[:, :PREFILL], f"{what}prefill logits")
    for pos in range(PREFILL, PREFILL + steps):
        logits, hidden, cache = ours(embeds[:, pos : pos + 1], pos, cache)
        close(logits, ref_logits[:, pos : pos + 1], f"{what}decode logits at {pos}")
    cp = ours.code_predictor
    prefill = torch.cat([hidden, ours.embed_codec(torch.tensor([[code0]]))], dim=1)
    out, pcache = cp(prefill, 0, cp.new_cache())
    ref_out = ref.code_predictor(inputs_embeds=prefill, use_cache=True)
    close(cp.head(0, out[:, -1:]), ref_out.logits[:, -1:], f"{what}predictor prefill logits")
    for j in range(1, 15):
        code = torch.tensor([[code_step * j]])
        out, pcache = cp(cp.embed(j - 1, code), j + 1, pcache)
        ref_out = ref.code_predictor(
            input_ids=code, past_key_values=ref_out.past_key_values,
            generation_steps=ref_out.generation_steps, use_cache=True,
        )  # fmt: skip
        close(cp.head(j, out), ref_out.logits, f"{what}predictor step {j} logits")


@pytest.mark.parametrize("layout", ["1.7b"])
@torch.no_grad()
def test_bf16_matches_official_eager_bf16(tiny_snapshot, layout):
    """bf16 numerics (cast order in RMSNorm, RoPE tables, fp32 softmax) equal the official eager bf16 path.

    A wrong cast order shows up as ~1 bf16 ulp (~0.4-0.8 %) errors; we allow 0.1 % of the scale.
    """
    from support import official

    path = tiny_snapshot(kind="base", layout=layout)
    ours = load_checkpoint(path, dtype="bfloat16", components=("talker",)).model.talker
    ref = (
        official.qwen_tts()
        .Qwen3TTSModel.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager")
        .model.talker
    )

    def close(a, b, what):
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 1e-3 * b.float().abs().max().item(), f"{what}: bf16 max abs err {err:.3e}"

    _talker_then_predictor(ours, ref, close, steps=4, seed=5, code0=7, code_step=100, what="")


@pytest.mark.slow
@torch.no_grad()
def test_full_size_06b_talker_and_predictor(tmp_path_factory, official_tts, record_property):
    """Real 0.6B dimensions (28 layers, head_dim 128, 16/8 heads): same tolerance as the tiny checks.

    Writes a full-size random snapshot (~4.3 GB, ~1-2 min) and loads it twice (ours mmapped,
    official in fp32): needs ~10 GB of RAM. Run with ``pytest -m slow``; the worst error / scale
    ratio is recorded as the ``worst_rel_err`` property (``--junitxml``; docs/fidelity.md has the last run).
    """
    from qtts.tools.random_checkpoint import write_random_checkpoint

    path = write_random_checkpoint(
        str(tmp_path_factory.mktemp("full") / "cv06"), size="full", kind="custom_voice"
    )
    ours = load_checkpoint(path, components=("talker",)).model.talker
    ref = official_tts(path).model.talker
    worst = []

    def close(a, b, what):
        assert_close(a, b, what)
        worst.append(((a.float() - b.float()).abs().max() / b.float().abs().max()).item())

    _talker_then_predictor(ours, ref, close, steps=3, seed=6, code0=11, code_step=123, what="full-size ")
    record_property("worst_rel_err", max(worst))
    record_property("checks", len(worst))
