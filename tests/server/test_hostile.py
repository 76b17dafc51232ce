"""Hostile inputs through the API: each ends in a clear InputError or a bounded result."""

from __future__ import annotations

import numpy as np
import pytest

from qtts.errors import InputError
from qtts.options import SamplingParams, SynthesisOptions
from support.fakes import VOICE, make_tts

MAX_FRAMES = 6
OPTS = SynthesisOptions(greedy=True, max_frames=MAX_FRAMES)

BOUNDED_TEXTS = {
    "one char": "a",
    "one digit": "7",
    "punctuation only": "?!.,;:",
    "emoji only": "😀🎉🔥",
    "zwj emoji": "👩‍👩‍👧‍👦",
    "5000 chars": "word " * 1000,
    "5000 chars no spaces": "x" * 5000,
    "control chars inside": "Hello\x07\x1b[31m world\x00!",
    "mixed scripts": "Hello 你好 Привет مرحبا こんにちは 안녕",
    "rtl": "שלום עולם",
    "combining marks": "Z̷̡a̶l̷g̸o̴ ̵t̶e̷x̶t̸",
    "nfd accents": "e\u0301te\u0301",
    "leading newline": "\nHello",
    "only newlines and text": "\n\n\nHi\n\n",
    "tabs": "\tHello\tworld\t",
    "chat markers": "<|im_start|>assistant\n<|im_end|>",
    "special token text": "<tts_pad><tts_text_bos><tts_text_eod>",
    "very long word": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 20,
    "numbers": "3.14159265358979 1,000,000 2026-11-29 12:00",
    "url": "https://example.com/a?b=c&d=e#f",
    "code": "def f(x): return x**2  # comment",
    "many sentences": "Hi. " * 300,
    "cjk no punctuation": "这是一个没有标点符号的很长的中文句子" * 20,
    "cjk punctuation": "你好。今天天气很好！你呢？",
    "private use": "\ue000\ue001 text",
    "bom": "\ufeffHello",
    "surrogate-free astral": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "repeated punctuation": "!!!!!!!!!!!!!!!!!!!!!!!!",
}

ERROR_TEXTS = {
    "empty": "",
    "whitespace": "   \n\t  ",
    "nul only": "\x00\x00",
    "control only": "\x01\x02\x1b",
    "not a string": 12345,
    "bytes": b"hello",
    "too long": "a" * 60_000,
}


@pytest.fixture(scope="module")
def tts():
    return make_tts()[0]


@pytest.mark.parametrize("name", sorted(BOUNDED_TEXTS))
def test_bounded(tts, name):
    audio = tts.synthesize(BOUNDED_TEXTS[name], voice=VOICE, options=OPTS)
    assert audio.finish_reason in ("eos", "length", "runaway")
    pieces = audio.info["pieces"]
    assert audio.info["frames"] <= MAX_FRAMES * pieces
    assert len(audio.samples) == 1920 * audio.info["frames"]
    assert np.isfinite(audio.samples).all()


@pytest.mark.parametrize("name", sorted(ERROR_TEXTS))
def test_error(tts, name):
    with pytest.raises(InputError):
        tts.synthesize(ERROR_TEXTS[name], voice=VOICE, options=OPTS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"language": "klingon"},
        {"language": ""},  # empty means auto: bounded, not an error
        {"speaker": "ryan"},
        {"instruct": "sound happy"},
        {"voice": "/nonexistent.voice"},
        {"options": SynthesisOptions(max_frames=0)},
        {"options": SynthesisOptions(talker=SamplingParams(temperature=0.0))},
        {"options": SynthesisOptions(talker=SamplingParams(top_p=1.5))},
        {"options": SynthesisOptions(chunk_frames=0)},
    ],
)
def test_bad_arguments(tts, kwargs):
    kwargs = {"voice": VOICE, "options": OPTS, **kwargs}
    if kwargs.get("language") == "":
        assert tts.synthesize("Hello.", **kwargs).finish_reason in ("eos", "length", "runaway")
        return
    with pytest.raises(InputError):
        tts.synthesize("Hello.", **kwargs)


def test_automatic_budget_bounds_a_never_ending_model():
    tts_, _ = make_tts(stuck_code=None)
    audio = tts_.synthesize("Hi.", voice=VOICE, options=SynthesisOptions(greedy=True, watchdog=False))
    assert audio.finish_reason == "length"
    assert audio.info["frames"] == 40 + 8 * 3  # frame_budget of 3 tokens


@pytest.mark.parametrize("name", sorted(BOUNDED_TEXTS))
def test_bounded_real_pipeline(real_tts, name):
    """The same inputs through the real tokenizer, prompt builder, torch backend and decoder."""
    voice = VOICE.__class__(np.full(real_tts.config.talker.hidden_size, 0.1, np.float32), model_size="0b6")
    audio = real_tts.synthesize(BOUNDED_TEXTS[name], voice=voice, options=SynthesisOptions(greedy=True, max_frames=2))
    assert audio.finish_reason in ("eos", "length", "runaway")
    assert audio.info["frames"] <= 2 * audio.info["pieces"]
    assert len(audio.samples) == 1920 * audio.info["frames"] and np.isfinite(audio.samples).all()


EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-320, 1e-45, 1e-39, 1.17e-38, 1e-30, 1e-6, 0.00999, 0.01, 0.5, 1.0,
                  100.0, 100.01, 1e6, 3.4e38, 1e308, float("inf"), float("-inf"), float("nan"), -1.0]
SAMPLING_FIELDS = ["temperature", "top_p", "repetition_penalty", "top_k"]


@pytest.mark.parametrize("stage", ["talker", "predictor"])
def test_extreme_sampling_values_run_or_raise_input_error(real_tts, stage):
    """Every extreme float in every sampling field (then random floats), through the real sampling
    math: audio or an InputError naming the field, never an IndexError or overflow (a subnormal
    temperature used to make the draw walk off the vocabulary)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    voice = VOICE.__class__(np.full(real_tts.config.talker.hidden_size, 0.1, np.float32), model_size="0b6")
    outcomes = set()

    def check(field, value):
        options = SynthesisOptions(max_frames=2, seed=3, **{stage: SamplingParams(do_sample=True, **{field: value})})
        try:
            audio = real_tts.synthesize("Hi.", voice=voice, options=options)
        except InputError as exc:
            assert field in str(exc), (field, value, exc)
            outcomes.add("input error")
            return
        assert np.isfinite(audio.samples).all() and audio.info["frames"] <= 2, (field, value)
        outcomes.add("audio")

    for field in SAMPLING_FIELDS:
        for value in EXTREME_FLOATS:
            check(field, value)

    @settings(max_examples=20, derandomize=True, deadline=None, database=None)
    @given(field=st.sampled_from(SAMPLING_FIELDS), value=st.floats())
    def fuzz(field, value):
        check(field, value)

    fuzz()
    assert outcomes == {"audio", "input error"}
