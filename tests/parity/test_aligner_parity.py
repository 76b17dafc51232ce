"""qtts's forced aligner vs the official Qwen3ForcedAligner (qwen-asr 0.0.6) on a tiny random checkpoint.

Random weights test the mechanism, not alignment quality: the times are arbitrary (often far past
the audio's end), but they must be the official ones, stage by stage. The checkpoint's weights
are fan-in scaled (qtts.tools.random_aligner) so the markers' classes vary with the audio and
the words; a test below checks that they do, so equal outputs are not equal by degeneracy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import REAL_TOKENIZER_DIR
from qtts.align import ForcedAligner, repair_timestamps
from qtts.text.words import split_words
from qtts.tools.random_checkpoint import write_random_checkpoint
from support.official_aligner import official_aligner, official_stages, qwen_asr, speechlike

pytestmark = pytest.mark.parity

TOKENIZER = REAL_TOKENIZER_DIR
CASES = {
    "english": ("Hello, world! This is a test of the aligner, isn't it?", "English", 3.0),
    "chinese": ("你好，世界！今天天气很好，我们去公园散步吧。", "Chinese", 4.0),
    "mixed": ("我们用 Python 3.11 写 qtts 的 aligner，timestamps 很准！", "Chinese", 3.5),
    "japanese": ("東京は日本の首都です。今日はいい天気ですね。", "Japanese", 3.0),
    "korean": ("안녕하세요, 오늘 날씨가 정말 좋네요.", "Korean", 2.5),
    "german_long": ("Über den Wolken muss die Freiheit wohl grenzenlos sein. " * 3, "German", 10.37),
}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_random_checkpoint(str(tmp_path_factory.mktemp("aligner") / "tiny"), kind="forced_aligner",
                                   tokenizer_dir=TOKENIZER, seed=3)  # fmt: skip


@pytest.fixture(scope="module")
def pair(snapshot):
    return official_aligner(snapshot), ForcedAligner.from_dir(snapshot)


@pytest.mark.parametrize("case", list(CASES))
def test_every_stage_matches_official(pair, case):
    official, ours = pair
    text, language, seconds = CASES[case]
    wav = speechlike(list(CASES).index(case), seconds)
    ref = official_stages(official, wav, 24000, text, language)
    words = split_words(text, language)
    assert words == ref["words"]
    ids, mel = ours.inputs(wav, 24000, words)
    assert ids.tolist() == ref["input_ids"].tolist()
    assert mel.shape == ref["features"].shape
    assert torch.allclose(mel, ref["features"], atol=1e-5)
    with torch.inference_mode():
        logits = ours.model(ids, mel)
    scale = ref["logits"].abs().max()
    assert (logits - ref["logits"]).abs().max() <= 1e-4 * scale
    times = ours.marker_times(ids, logits)
    assert times.tolist() == ref["times"].tolist()
    got = [(w.text, w.start, w.end) for w in ours.align(wav, 24000, text, language)]
    assert got == ref["result"]


def test_markers_depend_on_audio_and_words(pair):
    """Guard against degenerate random weights: the raw classes vary within a prompt and with the audio."""
    _, ours = pair
    text, language, seconds = CASES["english"]
    words = split_words(text, language)
    runs = []
    for seed in (1, 2):
        ids, mel = ours.inputs(speechlike(seed, seconds), 24000, words)
        with torch.inference_mode():
            runs.append(ours.marker_times(ids, ours.model(ids, mel)))
    assert len(set(runs[0].tolist())) >= 2
    assert runs[0].tolist() != runs[1].tolist()


def test_repair_matches_official_on_random_sequences():
    processor = qwen_asr().inference.qwen3_forced_aligner.Qwen3ForceAlignProcessor()
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 24))
        values = (rng.integers(0, 12, size=n) * 80.0).astype(np.float32)  # few levels: many ties and runs
        if rng.random() < 0.3:
            values = np.sort(values)
            values[rng.integers(0, n, size=3)] = rng.integers(0, 12) * 80.0
        assert repair_timestamps(values) == processor.fix_timestamp(values)


def test_word_split_matches_official():
    processor = qwen_asr().inference.qwen3_forced_aligner.Qwen3ForceAlignProcessor()
    texts = [("Don't stop—it's 3:45 p.m., O'Brien!", "english"), ("C'est l'été à Paris, n'est-ce pas ?", "French"),
             ("Привет, мир! 123 ёлки.", "Russian"), ("廣東話好難講㗎，你識唔識？", "Cantonese"),
             ("𠀀𪜀 abc𫝀def 丽", "Chinese"), ("  \t\n ", "English"), ("¡Hola! ¿Qué tal?", "Spanish"),
             ("ＡＢＣ１２３ full-width", "English"), ("東京タワーに行きました", "Japanese"),
             ("한국어 문장을 나눕니다", "Korean"), ("emoji 🙂 and e\u0301 combining", "English")]  # fmt: skip
    for text, language in texts:
        assert split_words(text, language) == processor.encode_timestamp(text, language)[0], text
