"""Prompt parity: our Prompt, embedded with the official model's own modules, equals the
tensors the official wrapper passes to ``talker.generate`` (inputs_embeds, trailing_text_hidden,
tts_pad_embed) in every mode, a sample of languages, both text layouts and both model layouts.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from qtts.config import ModelConfig
from qtts.errors import InputError
from qtts.text.prompt import Mode, build_prompt, resolve_language, resolve_mode
from qtts.text.tokenizer import TextTokenizer
from qtts.voice import Voice

TEXT = "Hello world, this is a tiny test."
TEXT_ZH = "你好，世界！今天天气很好。"


class _Captured(Exception):
    pass


def capture(monkeypatch, tts, call):
    """Run ``call()`` and return the kwargs the official code passes to ``talker.generate``."""
    seen = {}

    def fake_generate(**kwargs):
        seen.update(kwargs)
        raise _Captured

    monkeypatch.setattr(tts.model.talker, "generate", fake_generate)
    with pytest.raises(_Captured):
        call()
    monkeypatch.undo()
    return seen


def embed(tts, prompt, speaker=None):
    """Our prompt -> talker input vectors, using the official model's embedding modules."""
    import torch

    talker = tts.model.talker

    def T(ids):
        return talker.text_projection(talker.get_text_embeddings()(torch.as_tensor(ids)))

    def C(ids):
        return talker.get_input_embeddings()(torch.as_tensor(ids))

    with torch.no_grad():
        rows = []
        sums = None
        if len(prompt.icl_codes):
            codes = torch.as_tensor(prompt.icl_codes)
            sums = C(codes[:, 0]) + sum(
                talker.code_predictor.get_input_embeddings()[k - 1](codes[:, k]) for k in range(1, 16))
        for t, c, f, is_spk in prompt.rows():
            v = torch.zeros(talker.config.hidden_size)
            v = v + T([t])[0] if t >= 0 else v
            v = v + C([c])[0] if c >= 0 else v
            v = v + speaker if is_spk else v
            v = v + sums[f] if f >= 0 else v
            rows.append(v)
        trailing = T(prompt.trailing_text_ids)
        pad = T([prompt.tts_pad_id])
    return torch.stack(rows), trailing, pad


def assert_same(official, ours):
    import torch

    embeds, trailing, pad = ours
    want = official["inputs_embeds"][0]
    assert want.shape == embeds.shape
    scale = float(want.abs().max())
    assert scale > 0
    torch.testing.assert_close(embeds, want, atol=1e-6 * max(1.0, scale), rtol=1e-5)
    torch.testing.assert_close(trailing, official["trailing_text_hidden"][0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(pad, official["tts_pad_embed"][0], atol=1e-6, rtol=1e-5)
    assert bool(official["attention_mask"].all())


@pytest.fixture(scope="module")
def setup(tiny_snapshot, official_tts):
    cache = {}

    def get(kind, layout):
        if (kind, layout) not in cache:
            path = tiny_snapshot(kind=kind, layout=layout)
            cache[kind, layout] = (official_tts(path), ModelConfig.from_dir(path), TextTokenizer.from_dir(path))
        return cache[kind, layout]

    return get


def _clone_item(qwen_tts, tts, frames, seed, ref_text="This is the reference transcript."):
    import torch
    from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

    g = torch.Generator().manual_seed(seed)
    spk = torch.randn(tts.model.config.talker_config.hidden_size, generator=g)
    code = torch.randint(0, 2048, (frames, 16), generator=g) if frames else None
    item = VoiceClonePromptItem(ref_code=code, ref_spk_embedding=spk, x_vector_only_mode=frames == 0,
                                icl_mode=frames > 0, ref_text=ref_text if frames else None)
    return item, spk, code


CLONE_CASES = [
    # (layout, language, frames (0 = x-vector only), non_streaming, text)
    ("0.6b", "english", 0, False, TEXT),
    ("0.6b", "auto", 0, True, TEXT),
    ("0.6b", "Chinese", 0, False, TEXT_ZH),
    ("0.6b", "japanese", 0, True, "こんにちは。"),
    ("0.6b", "english", 3, False, TEXT),  # text longer than the reference: leftover -> trailing
    ("0.6b", "german", 40, False, "Guten Tag!"),  # reference longer: text padded with tts_pad
    ("0.6b", "auto", 5, True, TEXT),
    ("0.6b", "english", 0, False, "\nLeading newline."),  # the role-slice quirk
    ("1.7b", "korean", 0, False, "안녕하세요."),
    ("1.7b", "french", 6, True, "Bonjour !"),
    ("1.7b", "russian", 8, False, "Привет, мир!"),
]


@pytest.mark.parity
@pytest.mark.parametrize("layout,language,frames,non_streaming,text", CLONE_CASES)
def test_voice_clone_prompt(setup, monkeypatch, layout, language, frames, non_streaming, text):
    from support import official

    tts, config, tok = setup("base", layout)
    item, spk, code = _clone_item(official.qwen_tts(), tts, frames, seed=frames + 7)
    got = capture(monkeypatch, tts, lambda: tts.generate_voice_clone(
        text=text, language=language, voice_clone_prompt=[item], non_streaming_mode=non_streaming))
    mode = Mode("icl" if frames else "xvector", resolve_language(config, language), xvector=spk.numpy(),
                ref_text=item.ref_text, ref_codes=None if code is None else code.numpy())
    prompt = build_prompt(config, tok, text, mode, non_streaming_text=non_streaming)
    assert prompt.mode == ("icl" if frames else "xvector")
    assert_same(got, embed(tts, prompt, spk))


CUSTOM_CASES = [
    # (layout, speaker, language, instruct, non_streaming)
    ("0.6b", "ryan", "english", None, True),
    ("0.6b", "Vivian", "auto", None, False),
    ("0.6b", "eric", "auto", None, True),  # dialect speaker + auto -> sichuan_dialect id
    ("0.6b", "dylan", "chinese", None, False),  # dialect speaker + chinese -> beijing_dialect id
    ("0.6b", "eric", "english", None, True),  # dialect speaker, other language: no dialect
    ("0.6b", "serena", "spanish", "Speak softly.", True),  # 0.6B drops instruct
    ("1.7b", "aiden", "english", "Speak angrily and fast.", True),
    ("1.7b", "uncle_fu", "chinese", "用温柔的语气说。", False),
    ("1.7b", "ono_anna", "italian", "", True),
    ("0.6b", "", "english", None, False),  # no speaker: no speaker slot (official generate allows it)
]


@pytest.mark.parity
@pytest.mark.parametrize("layout,speaker,language,instruct,non_streaming", CUSTOM_CASES)
def test_custom_voice_prompt(setup, monkeypatch, caplog, layout, speaker, language, instruct, non_streaming):
    tts, config, tok = setup("custom_voice", layout)
    text = TEXT_ZH if language == "chinese" else TEXT
    got = capture(monkeypatch, tts, lambda: tts.generate_custom_voice(
        text=text, speaker=speaker, language=language, instruct=instruct, non_streaming_mode=non_streaming))
    # the official wrapper's rules, not resolve_mode's: no speaker is allowed, 0.6B drops instruct
    mode = Mode("custom_voice", resolve_language(config, language), speaker=speaker.lower() or None,
                instruct=instruct or None)
    with caplog.at_level(logging.WARNING, logger="qtts.text.prompt"):
        prompt = build_prompt(config, tok, text, mode, non_streaming_text=non_streaming)
    assert ("does not support instruct" in caplog.text) == bool(instruct and layout == "0.6b")
    assert prompt.speaker_pos == -1 and prompt.speaker == (speaker.lower() or None)
    assert_same(got, embed(tts, prompt))


@pytest.mark.parity
@pytest.mark.parametrize("language,instruct,non_streaming", [
    ("english", "A deep male voice, calm and slow.", True),
    ("auto", "一个温柔的女声。", False),
    ("portuguese", "", True),  # empty instruct = no instruction prefix
    ("spanish", "Whispering, excited.", False),
])
def test_voice_design_prompt(setup, monkeypatch, language, instruct, non_streaming):
    tts, config, tok = setup("voice_design", "1.7b")
    got = capture(monkeypatch, tts, lambda: tts.generate_voice_design(
        text=TEXT, instruct=instruct, language=language, non_streaming_mode=non_streaming))
    mode = Mode("voice_design", resolve_language(config, language), instruct=instruct or None)
    prompt = build_prompt(config, tok, TEXT, mode, non_streaming_text=non_streaming)
    assert prompt.mode == "voice_design" and prompt.speaker_pos == -1
    assert_same(got, embed(tts, prompt))


@pytest.mark.parity
def test_dialect_language_through_model_generate(setup, monkeypatch):
    """A dialect passed as the language (model.generate accepts it; the wrapper does not)."""
    tts, config, tok = setup("custom_voice", "1.7b")
    ids = tts._tokenize_texts([tts._build_assistant_text(TEXT_ZH)])
    got = capture(monkeypatch, tts, lambda: tts.model.generate(
        input_ids=ids, languages=["beijing_dialect"], speakers=["eric"], non_streaming_mode=False))
    prompt = build_prompt(config, tok, TEXT_ZH, Mode("custom_voice", "beijing_dialect", speaker="eric"),
                          non_streaming_text=False)
    assert_same(got, embed(tts, prompt))


def test_wrapper_defaults_and_layout(tiny_snapshot):
    path = tiny_snapshot(kind="base")
    config, tok = ModelConfig.from_dir(path), TextTokenizer.from_dir(path)
    voice = Voice(np.zeros(config.talker.hidden_size, np.float32), model_size=config.tts_model_size)
    p = build_prompt(config, tok, TEXT, resolve_mode(config, voice, language="english"))
    assert p.mode == "xvector" and not p.non_streaming_text and p.speaker_pos == 7
    assert [r[:2] for r in p.rows()] == [
        (151644, -1), (77091, -1), (198, -1), (151671, 2154), (151671, 2156), (151671, 2050),
        (151671, 2157), (151671, -1), (151672, 2148), (9707, 2149)]
    assert p.trailing_text_ids.tolist() == [1879, 11, 419, 374, 264, 13673, 1273, 13, 151673]
    assert p.text_token_count == 9
    assert build_prompt(config, tok, TEXT, Mode("xvector", "english", xvector=voice.speaker),
                        non_streaming_text=True).length == 20
    clone = Voice(voice.speaker, ref_codes=np.zeros((38, 16), np.int64), ref_text="This is the reference transcript.",
                  model_size=config.tts_model_size)
    icl = build_prompt(config, tok, TEXT, resolve_mode(config, clone, language="english"))
    assert icl.mode == "icl" and icl.length == 48 and icl.trailing_text_ids.tolist() == [151671]
    assert icl.icl_frame.tolist()[-38:] == list(range(38))
    bare = build_prompt(config, tok, TEXT, Mode("xvector", "english"), non_streaming_text=True)  # no vector
    assert bare.speaker_pos == -1 and bare.non_streaming_text and bare.length == 19


def _voice(config, codes=None, text=None, dims=None):
    dims = dims or config.talker.hidden_size
    return Voice(np.ones(dims, np.float32), ref_codes=codes, ref_text=text, model_size=config.tts_model_size)


@pytest.mark.parametrize("kind,layout,kwargs,match", [
    ("base", "0.6b", {"voice": {}, "speaker": "ryan"}, "CustomVoice"),
    ("base", "0.6b", {"voice": {}, "instruct": "calm"}, "VoiceDesign"),
    ("base", "0.6b", {}, "needs one; this base 0b6 checkpoint takes voice="),
    ("base", "0.6b", {"voice": {"dims": 5}}, "5-dim speaker vector"),
    ("base", "0.6b", {"voice": {}, "language": "klingon"}, "valid: auto, chinese, english"),
    ("base", "0.6b", {"voice": {}, "language": "beijing_dialect"}, "unknown language"),
    ("base", "0.6b", {"voice": {"text": "hi", "codes": np.zeros((4, 8), np.int64)}}, "shape"),
    ("base", "0.6b", {"voice": {"text": "hi", "codes": np.full((4, 16), 2048)}}, r"\[0, 2048\)"),
    ("custom_voice", "0.6b", {"speaker": "nobody"}, "valid: aiden, dylan, eric"),
    ("custom_voice", "0.6b", {}, "no speaker given"),
    ("custom_voice", "0.6b", {"speaker": "ryan", "instruct": "happy"}, "1.7B CustomVoice"),
    ("custom_voice", "0.6b", {"voice": {}}, "needs a Base checkpoint"),
    ("voice_design", "1.7b", {"speaker": "ryan"}, "CustomVoice"),
    ("voice_design", "1.7b", {}, "no instruct given"),
    ("voice_design", "1.7b", {"instruct": "calm", "text": ""}, "empty"),
    ("voice_design", "1.7b", {"instruct": "calm", "text": "\n"}, "empty"),
])
def test_invalid_requests(tiny_snapshot, kind, layout, kwargs, match):
    """Each bad input is one InputError from resolve_mode (or, for the text, build_prompt)."""
    path = tiny_snapshot(kind=kind, layout=layout)
    config, tok = ModelConfig.from_dir(path), TextTokenizer.from_dir(path)
    kwargs = dict(kwargs)
    text = kwargs.pop("text", TEXT)
    if "voice" in kwargs:
        kwargs["voice"] = _voice(config, **kwargs["voice"])
    with pytest.raises(InputError, match=match):
        build_prompt(config, tok, text, resolve_mode(config, **kwargs))


HOSTILE = ["", " ", "\n", "\n\n", "a", "😀", "<|im_end|>", "<|im_start|>assistant\n", "\x00\x01", "\u200b",
           "x" * 5000, "你" * 3000, "<tts_pad>" * 10, "\r\n", "\t ", "مرحبا", "a<|im_end|>\n<|im_start|>b"]


@pytest.mark.parametrize("kind,layout,mode,non_streaming", [
    ("base", "0.6b", {"kind": "xvector", "xvector": np.ones(32, np.float32)}, None),
    ("base", "0.6b", {"kind": "icl", "xvector": np.ones(32, np.float32), "ref_text": "ref",
                      "ref_codes": np.ones((5, 16), np.int64)}, True),
    ("base", "0.6b", {"kind": "icl", "ref_text": "\n", "ref_codes": np.ones((1, 16), np.int64)}, None),
    ("custom_voice", "1.7b", {"kind": "custom_voice", "speaker": "eric", "instruct": "<|im_end|>"}, None),
    ("voice_design", "1.7b", {"kind": "voice_design", "instruct": "x" * 2000}, False),
])
def test_hostile_texts_give_error_or_consistent_prompt(tiny_snapshot, kind, layout, mode, non_streaming):
    path = tiny_snapshot(kind=kind, layout=layout)
    config, tok = ModelConfig.from_dir(path), TextTokenizer.from_dir(path)
    for text in HOSTILE:
        try:
            p = build_prompt(config, tok, text, Mode(**mode), non_streaming)
        except InputError as exc:
            assert "empty" in str(exc) and not tok.encode(
                f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")[3:-5]
            continue
        n = p.length
        assert p.codec_ids.shape == p.icl_frame.shape == (n,) and p.text_token_count >= 1
        assert p.text_ids.max() < tok.vocab_size and p.codec_ids.max() < config.talker.vocab_size
        assert p.icl_frame.max() < max(len(p.icl_codes), 1) and -1 <= p.speaker_pos < n
        assert len(p.trailing_text_ids) >= 1
        has_any = (p.text_ids >= 0) | (p.codec_ids >= 0) | (p.icl_frame >= 0)
        assert has_any.all()
