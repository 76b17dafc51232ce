"""The one fake engine: a numpy fake of the backend seam for loop/API tests (no torch, no checkpoint),
and a whole fake TTS over it (:func:`make_tts`: fake tokenizer, backend and vocoder on a real config).

Deterministic: a tiny random recurrent "talker" whose logits depend on everything fed so far.
Knobs force the situations the loop must handle: EOS at a given frame, a stuck code, a cycle.
Every call is appended to ``events`` so tests can prove orderings without timing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from conftest import reference_configs
from qtts.api import TTS
from qtts.backends import Components
from qtts.backends.base import Backend, Vocoder, VocoderStream
from qtts.config import ModelConfig
from qtts.voice import Voice

EOS = 2150


@dataclass
class FakePrompt:
    text_ids: list
    codec_ids: list
    trailing_text_ids: list
    speaker_pos: int = -1
    icl_frame: list | None = None
    icl_codes: np.ndarray | None = None


def simple_prompt(n_trailing: int = 5) -> FakePrompt:
    text = [151644, 77091, 198, 151671, 151671, 151671, 151672, 9707]
    codec = [-1, -1, -1, 2155, 2156, 2157, 2148, 2149]
    return FakePrompt(text, codec, list(range(1000, 1000 + n_trailing)) + [151673])


@dataclass
class FakeBackend(Backend):
    hidden_size: int = 8
    seed: int = 0
    eos_at: int | None = None  # force EOS to be the best code 0 from this frame on
    stuck_code: int | None = None  # force this code 0 every frame
    cycle: tuple | None = None  # force code 0 to follow this cycle
    events: list = field(default_factory=list)

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        h = self.hidden_size
        self.text_table = rng.standard_normal((101, h)).astype(np.float32)
        self.codec_table = rng.standard_normal((3072, h)).astype(np.float32)
        self.cp_tables = rng.standard_normal((15, 2048, h)).astype(np.float32)
        self.w = rng.standard_normal((h, h)).astype(np.float32) / np.sqrt(h)
        self.head = rng.standard_normal((3072, h)).astype(np.float32)
        self.cp_head = rng.standard_normal((15, 2048, h)).astype(np.float32)
        self.talker_inputs: list[np.ndarray] = []
        self.frame = 0

    def text_embeds(self, ids):
        return self.text_table[np.asarray(ids) % 101]

    def codec_embeds(self, ids):
        return self.codec_table[np.asarray(ids)]

    def frame_embeds(self, codes):
        codes = np.asarray(codes)
        out = self.codec_table[codes[:, 0]].copy()
        for j in range(15):
            out += self.cp_tables[j][codes[:, j + 1]]
        return out

    def new_state(self, max_len):
        self.events.append(("new_state", max_len))
        return {"h": np.zeros(self.hidden_size, np.float32), "max_len": max_len}

    def talker(self, embeds, pos, state):
        embeds = np.asarray(embeds, np.float32)
        assert pos + len(embeds) <= state["max_len"], "KV state overflow"
        self.events.append(("talker", pos, len(embeds)))
        self.talker_inputs.append(embeds.copy())
        h = state["h"]
        for x in embeds:
            h = np.tanh(self.w @ h + x)
        logits = (self.head @ h).astype(np.float32)
        frame = 0 if len(embeds) > 1 else self.frame + 1
        self.frame = frame
        if self.eos_at is not None and frame >= self.eos_at:
            logits[EOS] = 100.0
        if self.stuck_code is not None:
            logits[self.stuck_code] = 100.0
        if self.cycle is not None:
            logits[self.cycle[frame % len(self.cycle)]] = 100.0
        return logits, h.copy(), {"h": h, "max_len": state["max_len"]}

    def predict_frame(self, hidden, code0, sampler, uniforms):
        self.events.append(("predict", int(code0)))
        hidden = np.asarray(hidden, np.float32)

        def step_logits(j, code):
            v = hidden + (self.codec_table[code] if j == 0 else self.cp_tables[j - 1][code])
            return self.cp_head[j] @ np.tanh(v)

        return sampler.frame(step_logits, code0, uniforms)


# ----------------------------------------------------------------------------- a whole fake TTS
H = 8


class FakeTokenizer:
    """Byte ids, except that the chat template's pieces are one id each (as in Qwen2), so the
    prompt builder's fixed slices leave exactly the text's bytes as the body."""

    SPECIAL = {"<|im_start|>": 151644, "<|im_end|>": 151645, "assistant": 77091, "user": 872}

    def encode(self, text):
        ids = []
        for part in re.split(r"(<\|im_start\|>|<\|im_end\|>|assistant|user)", text):
            ids += [self.SPECIAL[part]] if part in self.SPECIAL else [b % 101 for b in part.encode("utf-8")]
        return ids


class FakeVocoder(Vocoder):
    """``stream()`` gives a stateful decoder: each frame's samples depend on its code 0 and on how
    many frames came before in that stream."""

    def __init__(self, events):
        self.events = events
        self.streams = 0

    def stream(self):
        self.streams += 1
        return _FakeStream(self.events)


class _FakeStream(VocoderStream):
    def __init__(self, events):
        self.events = events
        self.n = 0

    def decode(self, codes):
        codes = np.asarray(codes)
        self.events.append(("decode", len(codes), codes.copy()))
        out = []
        for c in codes:
            out.append(np.full(1920, (c[0] % 97) / 97.0 + 0.001 * self.n, np.float32))
            self.n += 1
        return np.concatenate(out)


def make_tts(kind="Qwen3-TTS-12Hz-0.6B-Base", **backend_kw):
    cfg = ModelConfig.from_dir(reference_configs(kind), speech_tokenizer=False)
    cfg.talker_config.hidden_size = H
    backend = FakeBackend(hidden_size=H, **backend_kw)
    parts = Components(cfg, FakeTokenizer(), backend, FakeVocoder(backend.events))
    return TTS(parts), backend


VOICE = Voice(np.ones(H, np.float32), model_size="0b6")
