"""Word timestamps from the official Qwen3-ForcedAligner: prompt, one forward pass, decoding.

``ForcedAligner.from_dir(snapshot).align(audio, sample_rate, text, language)`` returns one
:class:`AlignedWord` (text, start, end in seconds) per word of :func:`qtts.text.words.split_words`,
like the official ``Qwen3ForcedAligner.align`` (qwen-asr 0.0.6):

1. the audio becomes mono 16 kHz and a 128-bin log-mel (:mod:`qtts.audio.aligner_features`);
2. the prompt is ``<|audio_start|>`` + one ``<|audio_pad|>`` per audio-encoder output +
   ``<|audio_end|>`` + ``w1<timestamp><timestamp>w2<timestamp><timestamp>...``, tokenized by the
   snapshot's Qwen2 tokenizer (:class:`qtts.text.tokenizer.TextTokenizer`);
3. one non-autoregressive pass of :class:`qtts.model.aligner.ForcedAlignerModel`;
4. at each ``<timestamp>`` position the argmax class times ``timestamp_segment_time`` (80 ms) is a
   time; the first of a word's two markers is its start, the second its end;
5. :func:`repair_timestamps` makes the times non-decreasing (longest non-decreasing subsequence
   kept; runs of 1-2 outliers take the nearer kept neighbour, longer runs are interpolated);
6. milliseconds -> seconds, rounded to the millisecond.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, InputError
from ..model.aligner_config import AlignerConfig

log = logging.getLogger(__name__)

AUDIO_START, AUDIO_PAD, AUDIO_END, TIMESTAMP = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>", "<timestamp>"


@dataclass(frozen=True)
class AlignedWord:
    text: str
    start: float  # seconds from the start of the aligned audio
    end: float


def prompt_text(words: list[str], audio_tokens: int) -> str:
    """The aligner's prompt string with ``audio_tokens`` audio placeholders."""
    body = "".join(w + TIMESTAMP + TIMESTAMP for w in words)
    return AUDIO_START + AUDIO_PAD * audio_tokens + AUDIO_END + body


def _kept_run(values: list[float]) -> list[bool]:
    """Membership of the longest non-decreasing subsequence (earliest end, earliest predecessors)."""
    n = len(values)
    best, parent = [1] * n, [-1] * n
    for i in range(1, n):
        for j in range(i):
            if values[j] <= values[i] and best[j] + 1 > best[i]:
                best[i], parent[i] = best[j] + 1, j
    kept = [False] * n
    i = best.index(max(best))
    while i != -1:
        kept[i], i = True, parent[i]
    return kept


def repair_timestamps(values) -> list[int]:
    """Non-decreasing integer times from raw ones (the official LIS repair, in milliseconds)."""
    values = [float(v) for v in values]
    if not values:
        return []
    kept, out, n = _kept_run(values), list(values), len(values)
    i = 0
    while i < n:
        if kept[i]:
            i += 1
            continue
        j = i
        while j < n and not kept[j]:
            j += 1
        left = next((out[k] for k in range(i - 1, -1, -1) if kept[k]), None)
        right = next((out[k] for k in range(j, n) if kept[k]), None)
        for k in range(i, j):
            if left is None or right is None:
                out[k] = right if left is None else left
            elif j - i <= 2:  # a short run: the nearer neighbour (ties go left)
                out[k] = left if k - (i - 1) <= j - k else right
            else:  # a long run: evenly spaced between the neighbours
                out[k] = left + (right - left) / (j - i + 1) * (k - i + 1)
        i = j
    return [int(v) for v in out]


def words_from_times(words: list[str], times_ms) -> list[AlignedWord]:
    """Pair the repaired marker times (2 per word) with the words; seconds rounded to 1 ms."""
    fixed = repair_timestamps(times_ms)
    if len(fixed) != 2 * len(words):
        raise ValueError(f"{len(fixed)} timestamp markers for {len(words)} words (2 per word expected)")
    return [AlignedWord(w, round(fixed[2 * i] / 1000.0, 3), round(fixed[2 * i + 1] / 1000.0, 3))
            for i, w in enumerate(words)]  # fmt: skip


def graph_feeds(input_ids, mel, cfg) -> dict:
    """Numpy feeds of the exported aligner graph for a prompt ``input_ids [1, T]`` and a log-mel
    ``[n_mels, frames]``: ``input_ids``, ``chunks`` and ``keep`` (:func:`qtts.model.aligner_audio.chunk_mel`)."""
    from ..model.aligner_audio import chunk_mel

    chunks, keep = chunk_mel(mel.float(), cfg.audio.chunk_frames)
    return {"input_ids": input_ids.numpy().astype(np.int64), "chunks": chunks.numpy(), "keep": keep.numpy()}


class ForcedAligner:
    """A loaded aligner snapshot: config, tokenizer and model (the torch module, or an ONNX graph behind
    the same call: :class:`qtts.align.runtime.OnnxAlignerModel`); ``runtime`` names which."""

    def __init__(self, config: AlignerConfig, tokenizer, model, runtime: str = "torch"):
        self.config, self.tokenizer, self.model, self.runtime = config, tokenizer, model, runtime
        for name, want in ((AUDIO_PAD, config.audio_token_id), (TIMESTAMP, config.timestamp_token_id)):
            got = tokenizer.token_to_id(name)
            if got != want:
                raise ConfigError(f"{config.source_dir}: the tokenizer gives {name} the id {got}, config.json "
                                  f"says {want}; the tokenizer files do not belong to this aligner")  # fmt: skip

    @classmethod
    def from_dir(cls, path: str, dtype="float32") -> ForcedAligner:
        from ..model.aligner import load_aligner
        from ..text.tokenizer import TextTokenizer

        cfg = AlignerConfig.from_dir(path)
        return cls(cfg, TextTokenizer.from_dir(path), load_aligner(path, dtype, config=cfg))

    def inputs(self, audio: np.ndarray, sample_rate: int, words: list[str]):
        """(input_ids ``[1, T]`` int64 tensor, log-mel ``[n_mels, frames]``) for one pair."""
        import torch

        from ..audio.aligner_features import log_mel, prepare_audio
        from ..model.aligner_audio import audio_tokens

        mel = log_mel(prepare_audio(audio, sample_rate), self.config.audio.num_mel_bins)
        ids = self.tokenizer.encode(prompt_text(words, audio_tokens(mel.shape[1], self.config.audio)))
        return torch.tensor([ids], dtype=torch.long), mel

    def marker_times(self, input_ids, logits) -> np.ndarray:
        """Raw times (ms, float32 like the official) at the ``<timestamp>`` positions."""
        at = input_ids[0] == self.config.timestamp_token_id
        classes = logits[0, at].argmax(dim=-1)
        return (classes * float(self.config.timestamp_segment_time)).cpu().numpy()

    def align(self, audio: np.ndarray, sample_rate: int, text: str, language: str) -> list[AlignedWord]:
        """Word timings of ``text`` spoken in ``audio`` (seconds from the start of ``audio``)."""
        import torch

        from ..text.words import split_words

        words = split_words(text, language)
        if not words:
            return []
        if np.asarray(audio).size == 0:
            raise InputError("no audio to align; give the samples the text was spoken in")
        input_ids, mel = self.inputs(audio, sample_rate, words)
        with torch.inference_mode():
            logits = self.model(input_ids, mel)
        return words_from_times(words, self.marker_times(input_ids, logits))
