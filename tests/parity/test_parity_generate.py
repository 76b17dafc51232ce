"""Greedy code parity with the official ``Qwen3TTSForConditionalGeneration.generate``.

Our path: Components (tokenizer + torch backend) + the prompt builder -> the numpy loop. Theirs: the
official model loaded from the same tiny random checkpoint, fed the same ids the official
wrapper builds, the same speaker vector and the same reference codes. All 16 codebooks of
every frame must be equal, for >= 40 frames, in every mode, layout and text mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qtts.backends import Components
from qtts.backends import open as open_components
from qtts.engine.generate import generate
from qtts.options import LoopParams, SynthesisOptions
from qtts.text.prompt import build_prompt, resolve_mode
from qtts.voice import Voice

FRAMES = 42
TEXT = "Hello world, this is a tiny parity test of the whole loop."
ZH = "今天天气很好，我们去公园散步吧。"

CASES = {
    # id: (kind, layout, mode kwargs, language, non_streaming_text, ref frames, text)
    "xvec-0.6b-stream": ("base", "0.6b", {}, "english", False, 0, TEXT),
    "xvec-0.6b-nonstream": ("base", "0.6b", {}, "auto", True, 0, TEXT),
    "icl-0.6b-stream-long-ref": ("base", "0.6b", {}, "english", False, 40, TEXT),
    "icl-0.6b-stream-short-ref": ("base", "0.6b", {}, "english", False, 5, TEXT),
    "icl-0.6b-nonstream": ("base", "0.6b", {}, "auto", True, 12, TEXT),
    "xvec-1.7b-stream": ("base", "1.7b", {}, "german", False, 0, TEXT),
    "icl-1.7b-stream": ("base", "1.7b", {}, "english", False, 9, TEXT),
    "custom-0.6b-nonstream": ("custom_voice", "0.6b", {"speaker": "ryan"}, "english", True, 0, TEXT),
    "custom-0.6b-stream": ("custom_voice", "0.6b", {"speaker": "vivian"}, "auto", False, 0, TEXT),
    "custom-dialect-0.6b": ("custom_voice", "0.6b", {"speaker": "eric"}, "chinese", True, 0, ZH),
    "custom-instruct-1.7b": ("custom_voice", "1.7b", {"speaker": "dylan", "instruct": "Speak slowly and calmly."},
                             "auto", True, 0, ZH),
    "design-1.7b-nonstream": ("voice_design", "1.7b", {"instruct": "A warm, deep male voice."}, "english", True, 0, TEXT),
    "design-1.7b-stream": ("voice_design", "1.7b", {"instruct": "A bright young voice."}, "auto", False, 0, TEXT),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch at one thread for this module


def _ours(parts: Components, text, voice, kwargs, language, non_streaming):
    opts = SynthesisOptions(greedy=True, non_streaming_text=non_streaming).resolve(parts.config.generation)
    mode = resolve_mode(parts.config, voice, kwargs.get("speaker"), kwargs.get("instruct"), language)
    prompt = build_prompt(parts.config, parts.tokenizer, text, mode, opts.non_streaming_text)
    lp = LoopParams(talker=opts.talker, predictor=opts.predictor, max_frames=FRAMES,
                    tts_pad_id=parts.config.tts_pad_token_id, watchdog=None)
    gen = generate(parts.backend, prompt, lp, speaker=mode.xvector)
    codes = np.array(list(gen)).reshape(-1, 16)
    return codes, gen.finish_reason


def _theirs(official, text, voice, kwargs, language, non_streaming):
    w = official
    ids = w._tokenize_texts([w._build_assistant_text(text)])
    call = dict(input_ids=ids, languages=[language], non_streaming_mode=non_streaming,
                max_new_tokens=FRAMES + 1, do_sample=False, subtalker_dosample=False)
    if voice is not None:
        icl = voice.icl
        call["voice_clone_prompt"] = dict(
            ref_code=[torch.from_numpy(voice.ref_codes) if icl else None],
            ref_spk_embedding=[torch.from_numpy(voice.speaker)],
            x_vector_only_mode=[not icl], icl_mode=[icl])
        call["ref_ids"] = [w._tokenize_texts([w._build_ref_text(voice.ref_text)])[0] if icl else None]
    if kwargs.get("speaker"):
        call["speakers"] = [kwargs["speaker"]]
    if kwargs.get("instruct"):
        call["instruct_ids"] = [w._tokenize_texts([w._build_instruct_text(kwargs["instruct"])])[0]]
    with torch.no_grad():
        codes, _ = w.model.generate(**call)
    return codes[0].numpy().astype(np.int64)


@pytest.mark.parity
@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_codes_equal_official(case, tiny_snapshot, official_tts):
    kind, layout, kwargs, language, non_streaming, ref_frames, text = CASES[case]
    path = tiny_snapshot(kind=kind, layout=layout)
    parts = open_components(path, threads=1)
    voice = None
    if kind == "base":
        rng = np.random.default_rng(len(case))
        hidden = parts.config.talker.hidden_size
        codes = rng.integers(0, 2048, (ref_frames, 16)) if ref_frames else None
        voice = Voice(rng.standard_normal(hidden).astype(np.float32), ref_codes=codes,
                      ref_text="This is the reference transcript." if ref_frames else None,
                      model_size=parts.config.tts_model_size)
    ours, reason = _ours(parts, text, voice, kwargs, language, non_streaming)
    theirs = _theirs(official_tts(path), text, voice, kwargs, language, non_streaming)
    assert len(theirs) >= 40, f"official stopped after {len(theirs)} frames; pick another input"
    assert ours.shape == theirs.shape
    mismatch = np.argwhere(ours != theirs)
    assert mismatch.size == 0, f"first mismatch at (frame, codebook) {tuple(mismatch[0])}"
    assert reason == "length"
