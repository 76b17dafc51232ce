"""Sampling: equality with the logits processors the official ``generate`` builds, and distribution checks."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import numpy as np
import pytest

from qtts.config import GenerationConfig
from qtts.engine import generate
from qtts.errors import InputError
from qtts.options import SamplingParams, SynthesisOptions

EOS = 2150
RULES = generate.talker_rules()


TALKER_CALL = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1)
PREDICTOR_CALL = dict(subtalker_dosample=True, subtalker_temperature=0.8, subtalker_top_k=30, subtalker_top_p=0.95)


@pytest.fixture(scope="module")
def official_builds(tiny_snapshot, official_tts):
    """The logits processors the official ``generate`` builds, intercepted during a real call.

    ``{"talker": (model, kwargs, processors), "predictor": (...)}``: transformers'
    ``GenerationMixin._get_logits_processor`` is wrapped while the official wrapper generates
    3 frames with distinct talker and sub-talker parameters; ``kwargs`` are its arguments, so
    :func:`official_processors` can ask the same builder for other parameter values.
    """
    import torch
    from transformers.generation.utils import GenerationMixin

    w = official_tts(tiny_snapshot(kind="custom_voice"))
    calls, orig = [], GenerationMixin._get_logits_processor

    def spy(self, *args, **kwargs):
        assert not args, "transformers now passes positional arguments; update the replay"
        out = orig(self, **kwargs)
        calls.append((self, kwargs, out))
        return out

    GenerationMixin._get_logits_processor = spy
    try:
        with torch.no_grad():
            w.generate_custom_voice(text="Hi there.", speaker="ryan", language="english", max_new_tokens=3,
                                    **TALKER_CALL, **PREDICTOR_CALL)  # fmt: skip
    finally:
        GenerationMixin._get_logits_processor = orig
    talker = [c for c in calls if c[0] is w.model.talker]
    predictor = [c for c in calls if c[0] is w.model.talker.code_predictor]
    assert len(talker) == 1 and len(predictor) >= 2 and len(calls) == len(talker) + len(predictor)
    return {"talker": talker[0], "predictor": predictor[0]}


def official_processors(build, params: SamplingParams):
    """The processor list the official builder makes for ``params`` (same call, other values)."""
    model, kwargs, _ = build
    config = copy.deepcopy(kwargs["generation_config"])
    config.do_sample = bool(params.do_sample)
    config.temperature, config.top_k, config.top_p = params.temperature, params.top_k, params.top_p
    config.repetition_penalty = params.repetition_penalty
    return model._get_logits_processor(**{**kwargs, "generation_config": config})


def apply(processors, logits, history) -> np.ndarray:
    import torch

    ids = torch.tensor([list(history)], dtype=torch.long).reshape(1, -1)
    scores = torch.from_numpy(np.array(logits, dtype=np.float32))[None]
    for p in processors:
        scores = p(ids, scores)
    return scores[0].numpy()


@pytest.mark.parity
def test_official_generate_builds_what_we_apply(official_builds):
    """The lists built in the real call: talker = penalty, EOS blocked twice (transformers derives
    ``min_length = min_new_tokens + 0`` from the official ``min_new_tokens=2``, so both processors
    block EOS for steps 0 and 1), suppression, then warpers; predictor = warpers only. Ours equals
    them on random logits and histories."""
    names = {k: [type(p).__name__ for p in v[2]] for k, v in official_builds.items()}
    assert names["talker"] == ["RepetitionPenaltyLogitsProcessor", "MinLengthLogitsProcessor",
                               "MinNewTokensLengthLogitsProcessor",
                               "SuppressTokensLogitsProcessor", "TemperatureLogitsWarper", "TopKLogitsWarper",
                               "TopPLogitsWarper"], names  # fmt: skip
    assert names["predictor"] == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"], names
    talker = SamplingParams(True, 0.7, 20, 0.9, 1.1)
    predictor = SamplingParams(True, 0.8, 30, 0.95, 1.0)
    rng = np.random.default_rng(3)
    for step in range(6):
        history = rng.integers(0, 2048, size=step).tolist()
        logits = (rng.standard_normal(3072) * 3).astype(np.float32)
        logits[EOS] = logits.max() + 1.0  # EOS on top: blocked at steps 0 and 1 only
        want = apply(official_builds["talker"][2], logits, history)
        np.testing.assert_array_equal(generate.process_logits(logits, talker, history, RULES), want)
        logits = (rng.standard_normal(2048) * 3).astype(np.float32)
        want = apply(official_builds["predictor"][2], logits, history)
        np.testing.assert_array_equal(generate.process_logits(logits, predictor, history), want)


GRID = list(itertools.product(
    [1.0, 1.05, 1.3],  # repetition penalty
    [0.5, 0.9, 1.0, 1.7],  # temperature
    [0, 1, 7, 50, 5000],  # top_k
    [1.0, 0.95, 0.5, 0.01],  # top_p
))


@pytest.mark.parity
@pytest.mark.parametrize("talker", [True, False])
def test_equals_official_processors_on_a_grid(talker, official_builds):
    """Every grid point, sampled and greedy: the official builder's list (asked with those values)
    vs ours. The predictor gets no penalty from the official code, so its grid keeps 1.0."""
    build = official_builds["talker" if talker else "predictor"]
    rng = np.random.default_rng(0 if talker else 1)
    vocab = 3072 if talker else 2048
    for n, (pen, temp, k, p) in enumerate(GRID[::2] if talker else GRID[1::2]):  # all of GRID, once
        params = SamplingParams(True, temp, k, p, pen if talker else 1.0)
        logits = (rng.standard_normal(vocab) * 3).astype(np.float32)
        if p == 1.0:  # ties (top-k keeps them all); top-p tie order is torch's unstable sort, not tested
            logits[rng.integers(0, vocab, 8)] = logits.max()
        history = rng.integers(0, 2048, size=n % 7).tolist() * 2  # repeated ids count once
        rules = RULES if talker else None
        for p_ in (params, dataclasses.replace(params, do_sample=False)):
            want = apply(official_processors(build, p_), logits, history)
            ours = generate.process_logits(logits, p_, history, rules)
            np.testing.assert_array_equal(ours, want, err_msg=f"{p_} history={history}")
            if not p_.do_sample:
                assert generate.choose(ours, False) == int(np.argmax(want))


def test_penalty_semantics_and_input_untouched():
    logits = np.array([2.0, -2.0, 1.0, 0.0], dtype=np.float32)
    before = logits.copy()
    out = generate.process_logits(logits, SamplingParams(False, 1.0, 0, 1.0, 2.0), [0, 0, 0, 1, 3])
    np.testing.assert_array_equal(out, [1.0, -4.0, 1.0, 0.0])  # each id once; 0 stays 0
    np.testing.assert_array_equal(logits, before)


def test_talker_rules_block_eos_and_control_ids():
    assert len(RULES.suppress_ids) == 1023 and EOS not in RULES.suppress_ids
    assert min(RULES.suppress_ids) == 2048 and max(RULES.suppress_ids) == 3071
    logits = np.zeros(3072, np.float32)
    logits[EOS] = 100.0
    logits[3000] = 200.0
    greedy = SamplingParams(False, 1.0, 0, 1.0, 1.0)
    assert generate.sample(logits, greedy, 0.5, [], RULES) != EOS  # min_new_tokens: step 0
    assert generate.sample(logits, greedy, 0.5, [7], RULES) != EOS  # step 1
    assert generate.sample(logits, greedy, 0.5, [7, 8], RULES) == EOS  # step 2: allowed
    rng = np.random.default_rng(0)
    warm = SamplingParams(True, 1.0, 0, 1.0, 1.0)
    picks = {generate.sample(logits, warm, rng, [1], RULES) for _ in range(500)}
    assert picks and max(picks) < 2048  # never a suppressed id, never EOS while blocked


def test_top_k_keeps_ties_and_top_p_keeps_one():
    s = generate.top_k_filter(np.array([3, 1, 3, 2, 3], np.float32), 2)
    np.testing.assert_array_equal(np.isfinite(s), [True, False, True, False, True])
    s = generate.top_p_filter(np.array([10, 0, 0], np.float32), 0.01)
    np.testing.assert_array_equal(np.isfinite(s), [True, False, False])


def test_choose_inverse_cdf_edges():
    scores = np.array([-np.inf, 0.0, -np.inf, 0.0, -np.inf], np.float32)
    assert generate.choose(scores, True, 0.0) == 1
    assert generate.choose(scores, True, 0.49) == 1
    assert generate.choose(scores, True, 0.51) == 3
    assert generate.choose(scores, True, np.nextafter(1.0, 0.0)) == 3


@pytest.mark.parametrize("temp,k,p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 8, 0.9)])
def test_sampled_frequencies_match_probabilities(temp, k, p):
    from scipy.stats import chisquare

    logits = np.random.default_rng(1234).standard_normal(16).astype(np.float32) * 1.5
    rng = np.random.default_rng(7)  # fixed: the p-value bound below is checked for this seed
    params = SamplingParams(True, temp, k, p, 1.0)
    probs = generate.softmax(generate.process_logits(logits, params))
    n = 20000
    counts = np.bincount([generate.sample(logits, params, rng) for _ in range(n)], minlength=16)
    live = probs > 0
    assert counts[~live].sum() == 0  # filtered ids are never drawn
    expected = probs[live].astype(np.float64)
    stat = chisquare(counts[live], expected / expected.sum() * n)
    assert stat.pvalue > 1e-3, (counts, probs)


def test_seeded_sampling_is_reproducible():
    logits = np.random.default_rng(5).standard_normal(2048).astype(np.float32)
    params = SamplingParams(True, 0.9, 50, 1.0, 1.0)

    def run(seed):
        rng = np.random.default_rng(seed)
        return [generate.sample(logits, params, rng) for _ in range(50)]

    assert run(3) == run(3) and run(3) != run(4)


def test_options_resolve_and_validate():
    gen = GenerationConfig(temperature=0.7, top_k=20, subtalker_top_k=30, repetition_penalty=1.1)
    opts = SynthesisOptions(talker=SamplingParams(top_p=0.9)).resolve(gen)
    assert opts.talker == SamplingParams(True, 0.7, 20, 0.9, 1.1)
    assert opts.predictor == SamplingParams(True, 0.9, 30, 1.0, 1.0)  # no penalty for the predictor
    greedy = SynthesisOptions(greedy=True).resolve(None)
    assert not greedy.talker.do_sample and not greedy.predictor.do_sample
    for bad in (SamplingParams(temperature=0), SamplingParams(top_p=1.5), SamplingParams(top_k=-1),
                SamplingParams(repetition_penalty=0)):
        with pytest.raises(InputError):
            SynthesisOptions(talker=bad).resolve(gen)
    with pytest.raises(InputError, match="max_frames"):
        SynthesisOptions(max_frames=0).resolve(gen)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 3
