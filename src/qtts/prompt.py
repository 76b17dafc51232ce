"""The talker prompt of every mode, as backend-agnostic id arrays (numpy).

A :class:`Prompt` describes the official ``Qwen3TTSForConditionalGeneration.generate``
inputs exactly (same positions, same order, same ids). Per position ``i`` the talker input is

    T(text_ids[i])            if text_ids[i] >= 0   (T = text_projection(text_embedding(.)))
  + C(codec_ids[i])           if codec_ids[i] >= 0  (C = talker codec_embedding)
  + speaker vector            if i == speaker_pos   (Base: the x-vector, added raw)
  + frame_sum(icl_codes[f])   if (f := icl_frame[i]) >= 0
                              (C(code 0) + sum_k predictor.codec_embedding[k-1](code k), k=1..15)

then, per decode step ``s``, ``T(trailing_text_ids[s])`` is added to the frame embedding
(``T(tts_pad)`` once the trailing ids are used up). Layouts per mode: docs/text.md.

Parity quirk kept on purpose: the official code tokenizes the whole chat string and slices
fixed positions ([:3] role, [3:-5] body). A text that starts with a newline merges with the
role's "\\n" ("\\n\\n" is one token), so the role carries id 271 instead of 198 and the body
loses that newline. We slice the same way, so our prompt equals the official one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .errors import InputError

log = logging.getLogger(__name__)

MODES = ("xvector", "icl", "custom_voice", "voice_design")
_MODES_OF = {"base": ("xvector", "icl"), "custom_voice": ("custom_voice",), "voice_design": ("voice_design",)}
NUM_CODEBOOKS = 16
CODEBOOK_SIZE = 2048


@dataclass(frozen=True, eq=False)
class Prompt:
    """Talker prefill (one entry per position, -1 = none) plus the trailing text ids."""

    text_ids: np.ndarray  # [L] int64
    codec_ids: np.ndarray  # [L] int64
    speaker_pos: int  # position that takes the external speaker vector, -1 = none
    icl_codes: np.ndarray  # [R, 16] int64 reference codes (R = 0 without ICL)
    icl_frame: np.ndarray  # [L] int64 row of icl_codes summed in at each position, -1 = none
    trailing_text_ids: np.ndarray  # [M] int64, one per decode step, then tts_pad
    mode: str  # one of MODES
    language: str  # resolved language name ('auto', 'english', 'sichuan_dialect', ...)
    non_streaming_text: bool
    text_token_count: int  # target text tokens (the body), for the frame budget
    tts_pad_id: int = 151671
    speaker: str | None = None  # CustomVoice speaker name (lower case)

    @property
    def length(self) -> int:
        return int(self.text_ids.shape[0])

    def rows(self) -> list[tuple[int, int, int, bool]]:
        """(text id, codec id, icl frame, is speaker slot) per position; handy for reading/debugging."""
        return [(int(t), int(c), int(f), i == self.speaker_pos)
                for i, (t, c, f) in enumerate(zip(self.text_ids, self.codec_ids, self.icl_frame))]


class _Rows:
    """Accumulates prompt positions."""

    def __init__(self):
        self.text: list[int] = []
        self.codec: list[int] = []
        self.frame: list[int] = []
        self.speaker_pos = -1

    def add(self, text: int = -1, codec: int = -1, frame: int = -1) -> None:
        self.text.append(int(text))
        self.codec.append(int(codec))
        self.frame.append(int(frame))


def _choices(items) -> str:
    return ", ".join(sorted(items))


def resolve_mode(config, mode, speaker, instruct, ref_codes) -> str:
    """The prompt mode for this checkpoint, or an InputError listing the valid ones."""
    kind = config.tts_model_type
    valid = _MODES_OF[kind]
    if mode is None:
        mode = ("icl" if ref_codes is not None else "xvector") if kind == "base" else valid[0]
    if mode not in MODES:
        raise InputError(f"unknown prompt mode '{mode}'; valid: {', '.join(MODES)}")
    if mode not in valid:
        need = {"xvector": "Base", "icl": "Base", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}
        raise InputError(
            f"mode '{mode}' needs a {need[mode]} checkpoint; this {kind} {config.tts_model_size} "
            f"checkpoint supports: {', '.join(valid)}"
        )
    if speaker and mode != "custom_voice":
        raise InputError(
            f"speaker '{speaker}' needs a CustomVoice checkpoint (this one is {kind}); "
            "clone a voice with a Base checkpoint instead"
        )
    if instruct and mode in ("xvector", "icl"):
        raise InputError("instruct needs a VoiceDesign or 1.7B CustomVoice checkpoint, not a Base one")
    return mode


def resolve_language(config, language: str | None) -> str:
    """Lower-case language name; 'auto', a codec language or (CustomVoice) a dialect."""
    lang = (language or "auto").strip().lower()
    valid = ["auto"] + sorted(config.talker.codec_language_id)
    if lang not in valid:
        raise InputError(f"unknown language '{language}'; valid: {', '.join(valid)}")
    return lang


def _language_id(config, lang: str, speaker: str | None) -> int | None:
    """Codec language id (None = auto), with the official dialect rule for CustomVoice speakers."""
    talker = config.talker
    lang_id = None if lang == "auto" else int(talker.codec_language_id[lang])
    dialect = talker.spk_is_dialect.get(speaker, False) if speaker else False
    if lang in ("chinese", "auto") and dialect:
        lang_id = int(talker.codec_language_id[dialect])
    return lang_id


def _codec_prefix(config, lang_id: int | None, speaker_codec: int | None, has_vector: bool) -> list:
    """Codec control ids up to (not including) the final codec_bos; 'SPK' marks the vector slot."""
    t = config.talker
    if lang_id is None:
        prefix = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    else:
        prefix = [t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id]
    if speaker_codec is not None:
        prefix.append(speaker_codec)
    elif has_vector:
        prefix.append("SPK")
    return prefix + [t.codec_pad_id]


def _check_ref_codes(ref_codes) -> np.ndarray:
    codes = np.asarray(ref_codes)
    if codes.ndim != 2 or codes.shape[1] != NUM_CODEBOOKS or codes.shape[0] < 1:
        raise InputError(f"ref_codes must have shape [frames, {NUM_CODEBOOKS}], got {codes.shape}")
    if not np.issubdtype(codes.dtype, np.integer):
        raise InputError(f"ref_codes must be integer codes, got dtype {codes.dtype}")
    if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
        raise InputError(f"ref_codes must lie in [0, {CODEBOOK_SIZE}), got [{codes.min()}, {codes.max()}]")
    return codes.astype(np.int64)


def _tokenize(tokenizer, text: str, ref_text: str | None, instruct: str | None, mode: str):
    """(role, body, ref_body, instruct_ids) sliced like the official code."""
    full = tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
    role, body = full[:3], full[3:-5]
    if not body:
        raise InputError("the text is empty (nothing to speak); pass at least one character")
    ref_body = None
    if mode == "icl":
        if not ref_text:
            raise InputError("ICL voice cloning needs ref_text (the transcript of the reference audio); "
                             "or use x-vector-only cloning")
        ref_body = tokenizer.encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[3:-2]
    instruct_ids = tokenizer.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n") if instruct else []
    return role, body, ref_body, instruct_ids


def _add_prefix(rows: _Rows, config, prefix: list) -> None:
    """Codec control positions: T(tts_pad) + C(id) each, T(tts_bos) on the last; 'SPK' = vector slot."""
    for i, cid in enumerate(prefix):
        text_id = config.tts_bos_token_id if i == len(prefix) - 1 else config.tts_pad_token_id
        if cid == "SPK":
            rows.speaker_pos = len(rows.text)
            rows.add(text_id)
        else:
            rows.add(text_id, cid)


def _body_plain(rows: _Rows, config, body: list[int], non_streaming: bool) -> list[int]:
    """Target text without ICL; returns the trailing text ids."""
    t, cfg = config.talker, config
    if not non_streaming:
        rows.add(body[0], t.codec_bos_id)
        return list(body[1:]) + [cfg.tts_eos_token_id]
    for tok in body:
        rows.add(tok, t.codec_pad_id)
    rows.add(cfg.tts_eos_token_id, t.codec_pad_id)
    rows.add(cfg.tts_pad_token_id, t.codec_bos_id)
    return [cfg.tts_pad_token_id]


def _body_icl(rows: _Rows, config, ref_body: list[int], body: list[int], n_frames: int,
              non_streaming: bool) -> list[int]:
    """ICL: reference + target text overlaid on [codec_bos] + reference frames; returns trailing ids."""
    t, cfg = config.talker, config
    text = list(ref_body) + list(body) + [cfg.tts_eos_token_id]
    codec = [(t.codec_bos_id, -1)] + [(-1, f) for f in range(n_frames)]
    if non_streaming:
        for tok in text:
            rows.add(tok, t.codec_pad_id)
        for cid, frame in codec:
            rows.add(cfg.tts_pad_token_id, cid, frame)
        return [cfg.tts_pad_token_id]
    n = len(codec)
    padded = text[:n] + [cfg.tts_pad_token_id] * max(0, n - len(text))
    for tok, (cid, frame) in zip(padded, codec):
        rows.add(tok, cid, frame)
    return text[n:] if len(text) > n else [cfg.tts_pad_token_id]


def _conditioning(config, mode, speaker, instruct, has_speaker_vector):
    """(speaker name, speaker codec id, instruct, has vector) after the official rules."""
    speaker_codec = None
    if mode == "custom_voice":
        if speaker:
            speaker = speaker.strip().lower()
            if speaker not in config.talker.spk_id:
                raise InputError(f"unknown speaker '{speaker}'; valid: {_choices(config.talker.spk_id)}")
            speaker_codec = config.talker.speaker_token(speaker)
        else:
            log.warning("CustomVoice prompt without a speaker: the voice is unconditioned")
        if instruct and config.tts_model_size in "0b6":  # the official wrapper's (substring) test
            log.warning("the 0.6B CustomVoice checkpoint does not support instruct; ignoring it "
                        "(like the official wrapper)")
            instruct = None
    if has_speaker_vector and mode not in ("xvector", "icl"):
        raise InputError(f"a speaker vector (voice clone) needs a Base checkpoint, not {mode}")
    if mode in ("xvector", "icl") and not has_speaker_vector:
        log.warning("Base prompt without a speaker vector: the voice is unconditioned")
    return (speaker or None), speaker_codec, (instruct or None), bool(has_speaker_vector)


def build_prompt(config, tokenizer, text: str, *, mode: str | None = None, language: str | None = "auto",
                 speaker: str | None = None, instruct: str | None = None, ref_text: str | None = None,
                 ref_codes=None, has_speaker_vector: bool | None = None,
                 non_streaming_text: bool | None = None) -> Prompt:
    """The official talker prompt for ``text`` (see the module docstring and docs/text.md).

    ``mode``: 'xvector' | 'icl' (Base) | 'custom_voice' | 'voice_design'; None = from the
    checkpoint type (Base: 'icl' when ``ref_codes`` are given). ``non_streaming_text`` None =
    the official wrapper default (False for Base, True otherwise). ``has_speaker_vector`` None =
    True for Base modes (False = a Base prompt without a speaker slot).
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    mode = resolve_mode(config, mode, speaker, instruct, ref_codes)
    lang = resolve_language(config, language)
    if has_speaker_vector is None:
        has_speaker_vector = mode in ("xvector", "icl")
    speaker, speaker_codec, instruct, has_vector = _conditioning(
        config, mode, speaker, instruct, has_speaker_vector)
    if non_streaming_text is None:
        non_streaming_text = mode in ("custom_voice", "voice_design")
    if mode == "icl" and ref_codes is None:
        raise InputError("ICL voice cloning needs ref_codes (the reference audio's speech codes)")
    codes = _check_ref_codes(ref_codes) if mode == "icl" else np.zeros((0, NUM_CODEBOOKS), np.int64)
    role, body, ref_body, instruct_ids = _tokenize(tokenizer, text, ref_text, instruct, mode)

    rows = _Rows()
    for tok in list(instruct_ids) + list(role):
        rows.add(tok)
    _add_prefix(rows, config, _codec_prefix(config, _language_id(config, lang, speaker), speaker_codec, has_vector))
    if mode == "icl":
        trailing = _body_icl(rows, config, ref_body, body, len(codes), bool(non_streaming_text))
    else:
        trailing = _body_plain(rows, config, body, bool(non_streaming_text))

    def arr(x):
        return np.asarray(x, dtype=np.int64)

    return Prompt(
        text_ids=arr(rows.text), codec_ids=arr(rows.codec), speaker_pos=rows.speaker_pos,
        icl_codes=codes, icl_frame=arr(rows.frame), trailing_text_ids=arr(trailing), mode=mode,
        language=lang, non_streaming_text=bool(non_streaming_text), text_token_count=len(body),
        tts_pad_id=int(config.tts_pad_token_id), speaker=speaker,
    )
