"""Natural EOS: the official ``generate`` and qtts stop at the same frame with the same codes.

The checkpoints are tiny random ones written with ``natural_eos=True``: their talker chooses
EOS by itself some frames after the text is used up (see ``qtts.tools.random_weights.eos_clock_edits``),
so the stop is decided by the model, not by a frame budget. Both sides run greedy through their
public APIs and are compared as audio (``parity_e2e``: every code of every frame, and the length).
"""

from __future__ import annotations

import numpy as np
import pytest

import qtts
from qtts.options import SynthesisOptions
from support.parity_e2e import SPF, assert_same_audio, official_clone, official_custom, prompt_item

pytestmark = pytest.mark.parity

BUDGET = 90  # frames; every case must stop well before it
TEXT = "Hello world, this is a parity test."

CASES = {
    # id: (kind, layout, language, non_streaming_text, ICL reference frames, speaker, instruct, text)
    "xvec-0.6b": ("base", "0.6b", "english", False, 0, None, None, TEXT),
    "xvec-1.7b-nonstream": ("base", "1.7b", "auto", True, 0, None, None, TEXT),
    "icl-1.7b": ("base", "1.7b", "english", False, 6, None, None, TEXT),
    "custom-0.6b": ("custom_voice", "0.6b", "english", True, 0, "ryan", None, TEXT),
}


@pytest.fixture(scope="module")
def loaded(eos_snapshot, official_tts):
    cache = {}

    def get(kind, layout):
        if (kind, layout) not in cache:
            path = eos_snapshot(kind, layout)
            cache[(kind, layout)] = (qtts.load(path, threads=1), official_tts(path))
        return cache[(kind, layout)]

    return get


def _voice(tts, case: str, ref_frames: int):
    rng = np.random.default_rng(len(case))
    hidden = tts.config.talker.hidden_size
    return qtts.Voice(
        rng.standard_normal(hidden).astype(np.float32),
        ref_codes=rng.integers(0, 2048, (ref_frames, 16)) if ref_frames else None,
        ref_text="This is the reference." if ref_frames else None, model_size=tts.model_size,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_natural_eos_same_frame_same_codes(case, loaded):
    kind, layout, language, non_streaming, ref_frames, speaker, instruct, text = CASES[case]
    tts, official = loaded(kind, layout)
    opts = SynthesisOptions(greedy=True, max_frames=BUDGET, watchdog=False, non_streaming_text=non_streaming,
                            split_sentences=False)  # fmt: skip
    if kind == "base":
        voice = _voice(tts, case, ref_frames)
        ours = tts.synthesize(text, voice=voice, language=language, options=opts)
        theirs = official_clone(official, text, [prompt_item(voice)], language, non_streaming, BUDGET)
    else:
        ours = tts.synthesize(text, speaker=speaker, instruct=instruct, language=language, options=opts)
        theirs = official_custom(official, text, speaker, language, instruct, non_streaming, BUDGET)
    frames = ours.info["frames"]
    assert ours.finish_reason == "eos", f"qtts stopped by {ours.finish_reason} after {frames} frames"
    assert len(theirs) // SPF < BUDGET, "the official generate ran to its budget (no EOS)"
    assert 8 <= frames <= 60, f"EOS after {frames} frames: the clock should stop mid-way"
    assert len(ours.samples) == frames * SPF
    assert_same_audio(ours.samples, theirs, case)
