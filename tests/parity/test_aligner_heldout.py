"""Held-out aligner parity: a checkpoint built and saved by the official classes, in shapes qtts never writes.

qtts's writer (qtts.tools.random_aligner) is not involved: the official ``Qwen3ASRForConditionalGeneration``
is built from an odd config (80 mel bins, 3 audio heads of 8, 6 query heads on 2 kv heads, head_dim 8,
777 timestamp classes of 40 ms, rope theta 10^4, eps 1e-5), its weights are re-drawn in place so the
markers' classes vary, and ``save_pretrained`` writes the file. qtts must load it strictly and give
the official times.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from conftest import REAL_TOKENIZER_DIR
from qtts.align import ForcedAligner
from qtts.tools.random_aligner import (
    AUDIO_END_ID,
    AUDIO_PAD_ID,
    AUDIO_START_ID,
    TIMESTAMP_ID,
    tokenizer_config_dict,
)
from qtts.tools.random_checkpoint import real_config_dir
from support.official_aligner import official_aligner, official_stages, qwen_asr, speechlike

pytestmark = pytest.mark.parity

TOKENIZER = REAL_TOKENIZER_DIR
ODD = {
    "model_type": "qwen3_asr",
    "timestamp_token_id": TIMESTAMP_ID,
    "timestamp_segment_time": 40,
    "support_languages": ["English", "Chinese"],
    "thinker_config": {
        "model_type": "qwen3_forced_aligner", "classify_num": 777, "audio_token_id": AUDIO_PAD_ID,
        "audio_start_token_id": AUDIO_START_ID, "audio_end_token_id": AUDIO_END_ID,
        "audio_config": {"num_mel_bins": 80, "encoder_layers": 3, "encoder_attention_heads": 3,
                         "encoder_ffn_dim": 40, "d_model": 24, "output_dim": 48, "downsample_hidden_size": 6,
                         "n_window": 50, "n_window_infer": 800},
        "text_config": {"vocab_size": 152064, "hidden_size": 48, "intermediate_size": 72, "num_hidden_layers": 3,
                        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5,
                        "rope_theta": 10000.0, "tie_word_embeddings": False,
                        "rope_scaling": {"interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default"}},
    },
}  # fmt: skip


def _redraw(model: torch.nn.Module) -> None:
    """Fan-in scaled matrices, N(0,1) embeddings (zero <timestamp> row), norms near 1: informative markers."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("embed_tokens.weight"):
                p.copy_(noise)
                p[TIMESTAMP_ID] = 0.0
            elif p.dim() >= 2:
                p.copy_(noise * (1.5 / math.sqrt(p[0].numel())))
            elif "norm" in name or "ln_post" in name:
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.02 * noise)
            else:
                p.copy_(0.05 * noise)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    backend = qwen_asr().core.transformers_backend
    out = str(tmp_path_factory.mktemp("aligner_odd"))
    model = backend.Qwen3ASRForConditionalGeneration(backend.Qwen3ASRConfig(**json.loads(json.dumps(ODD))))
    _redraw(model)
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(ODD, fh)  # the thinker's model_type must say forced aligner, as the published file does
    with open(os.path.join(real_config_dir("Qwen3-TTS-12Hz-0.6B-Base"), "tokenizer_config.json"), encoding="utf-8") as fh:
        tok = tokenizer_config_dict(json.load(fh))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(tok, fh)
    pre = {"feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "Qwen3ASRProcessor",
           "feature_size": 80, "sampling_rate": 16000, "hop_length": 160, "n_fft": 400, "chunk_length": 30,
           "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True}  # fmt: skip
    with open(os.path.join(out, "preprocessor_config.json"), "w", encoding="utf-8") as fh:
        json.dump(pre, fh)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(TOKENIZER, name), os.path.join(out, name))
    return out


@pytest.mark.parametrize(("text", "language", "seconds"), [
    ("The quick brown fox jumps over the lazy dog, twice!", "English", 4.2),
    ("混合 script 的句子：GPU 和 CPU 都能跑。", "Chinese", 12.3),
])  # fmt: skip
def test_official_built_checkpoint_matches(snapshot, text, language, seconds):
    official = official_aligner(snapshot)
    ours = ForcedAligner.from_dir(snapshot)
    assert ours.model.thinker.lm_head.out_features == 777
    wav = speechlike(int(seconds * 10), seconds)
    ref = official_stages(official, wav, 24000, text, language)
    ids, mel = ours.inputs(wav, 24000, ref["words"])
    assert ids.tolist() == ref["input_ids"].tolist() and mel.shape[0] == 80
    with torch.inference_mode():
        logits = ours.model(ids, mel)
    assert (logits - ref["logits"]).abs().max() <= 1e-4 * ref["logits"].abs().max()
    assert ours.marker_times(ids, logits).tolist() == ref["times"].tolist()
    assert len(set(ref["times"].tolist())) >= 2  # informative, not one class everywhere
    assert [(w.text, w.start, w.end) for w in ours.align(wav, 24000, text, language)] == ref["result"]
