"""Conditioning and the talker prompt of every mode: validated once, laid out as numpy id arrays.

:func:`resolve_mode` checks what a call asks for against what the checkpoint supports and
returns a :class:`Mode`; every bad input is one :class:`~qtts.errors.InputError` that lists what
is valid:

| checkpoint     | valid conditioning                                   |
|----------------|------------------------------------------------------|
| Base           | ``voice`` (x-vector only, or ICL with reference text) |
| CustomVoice    | ``speaker`` (+ ``instruct`` on 1.7B)                  |
| VoiceDesign    | ``instruct``                                          |

:func:`build_prompt` lays a resolved mode and one text piece out as a :class:`Prompt`, the
official ``Qwen3TTSForConditionalGeneration.generate`` inputs exactly (same positions, same
order, same ids). Per position ``i`` the talker input is

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
import unicodedata
from dataclasses import dataclass

import numpy as np

from ..config import CODEBOOK_SIZE, NUM_CODEBOOKS
from ..errors import InputError

log = logging.getLogger(__name__)

MODES = ("xvector", "icl", "custom_voice", "voice_design")
MAX_TEXT_CHARS = 50_000


@dataclass(frozen=True, eq=False)
class Mode:
    """A checked conditioning request (build it with :func:`resolve_mode`)."""

    kind: str  # one of MODES
    language: str = "auto"  # 'auto', a codec language or (CustomVoice) a dialect, lower case
    speaker: str | None = None  # CustomVoice speaker name (lower case)
    instruct: str | None = None  # VoiceDesign / 1.7B CustomVoice instruction
    xvector: np.ndarray | None = None  # clone modes: the speaker vector added at the speaker slot
    ref_text: str | None = None  # ICL: the reference transcript
    ref_codes: np.ndarray | None = None  # ICL: the reference audio's codes [frames, 16] int64

    @property
    def icl(self) -> bool:
        return self.kind == "icl"


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


def valid_conditioning(config) -> str:
    """What the checkpoint takes, in keyword words (the CLI and the server translate them:
    ``qtts.cli.common.cli_words``, ``qtts.server.errors.http_words``)."""
    t = config.tts_model_type
    if t == "base":
        return "voice=<Voice or .voice file>"
    if t == "custom_voice":
        extra = " and optionally instruct=..." if config.tts_model_size == "1b7" else ""
        return f"speaker=<one of: {', '.join(config.speakers)}>{extra}"
    return "instruct=<a description of the voice>"


def _fail(config, problem: str):
    raise InputError(f"{problem}; this {config.tts_model_type} {config.tts_model_size} checkpoint takes "
                     f"{valid_conditioning(config)}")


def resolve_language(config, language: str | None) -> str:
    """Lower-case language name: 'auto', a codec language or (CustomVoice) a dialect."""
    lang = (language or "auto").strip().lower()
    if lang not in config.languages:
        raise InputError(f"unknown language '{language}'; valid: {', '.join(config.languages)}")
    return lang


def resolve_mode(config, voice=None, speaker: str | None = None, instruct: str | None = None,
                 language: str | None = None) -> Mode:
    """The :class:`Mode` for these arguments, or an InputError that lists the valid ones."""
    lang = resolve_language(config, language)
    instruct = instruct.strip() if isinstance(instruct, str) and instruct.strip() else None
    kind = config.tts_model_type
    if kind == "base":
        return _clone_mode(config, voice, speaker, instruct, lang)
    if voice is not None:
        _fail(config, "voice cloning needs a Base checkpoint")
    if kind == "custom_voice":
        return _speaker_mode(config, speaker, instruct, lang)
    if speaker:
        _fail(config, f"speaker '{speaker}' needs a CustomVoice checkpoint")
    if not instruct:
        _fail(config, "no instruct given")
    return Mode("voice_design", lang, instruct=instruct)


def _clone_mode(config, voice, speaker, instruct, lang: str) -> Mode:
    if speaker:
        _fail(config, f"speaker '{speaker}' needs a CustomVoice checkpoint")
    if instruct:
        _fail(config, "instruct needs a VoiceDesign or 1.7B CustomVoice checkpoint")
    if voice is None:
        _fail(config, "a Base checkpoint clones a voice and needs one")
    voice.check_compatible(config.tts_model_type, config.tts_model_size, config.talker.hidden_size)
    if not voice.icl:
        return Mode("xvector", lang, xvector=voice.speaker)
    codes = _check_ref_codes(voice.ref_codes)
    return Mode("icl", lang, xvector=voice.speaker, ref_text=voice.ref_text, ref_codes=codes)


def _speaker_mode(config, speaker, instruct, lang: str) -> Mode:
    if not speaker:
        _fail(config, "no speaker given")
    name = speaker.strip().lower()
    if name not in config.speakers:
        raise InputError(f"unknown speaker '{speaker}'; valid: {', '.join(config.speakers)}")
    if instruct and config.tts_model_size != "1b7":
        _fail(config, "instruct needs the 1.7B CustomVoice (or VoiceDesign) checkpoint")
    return Mode("custom_voice", lang, speaker=name, instruct=instruct)


def _empty(what: str) -> InputError:
    return InputError(f"{what} is empty (nothing to speak after removing whitespace and invisible format or "
                      "control characters)")


def speakable(text: str) -> bool:
    """The one rule for "empty" text (every surface: API, CLI, HTTP, WebSocket, Wyoming): True when
    ``text`` has a character that is neither whitespace nor a control, format, surrogate,
    private-use or unassigned character (category C*: invisible, or dropped before the model)."""
    return any(not ch.isspace() and unicodedata.category(ch)[0] != "C" for ch in text)


def clean_text(text, what: str = "text") -> str:
    """NFC, control characters (except newline/tab) removed, stripped; not :func:`speakable` ->
    InputError."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"{what} has {len(text)} characters; the limit is {MAX_TEXT_CHARS} per call (split it)")
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs"))
    text = text.strip()
    if not speakable(text):
        raise _empty(what)
    return text


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


def _tokenize(tokenizer, text: str, mode: Mode, instruct: str | None):
    """(role, body, ref_body, instruct_ids) sliced like the official code."""
    full = tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
    role, body = full[:3], full[3:-5]
    if not body:
        raise _empty("the text")
    ref_body = None
    if mode.icl:
        ref_body = tokenizer.encode(f"<|im_start|>assistant\n{mode.ref_text}<|im_end|>\n")[3:-2]
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


def _instruct(config, mode: Mode) -> str | None:
    """The instruct the official wrapper keeps: the 0.6B CustomVoice drops it (with a warning)."""
    if mode.kind == "custom_voice" and mode.instruct and config.tts_model_size in "0b6":  # its substring test
        log.warning("the 0.6B CustomVoice checkpoint does not support instruct; ignoring it "
                    "(like the official wrapper)")
        return None
    return mode.instruct


def build_prompt(config, tokenizer, text: str, mode: Mode, non_streaming_text: bool | None = None) -> Prompt:
    """The official talker prompt for one piece of ``text`` in a resolved ``mode`` (module docstring).

    ``non_streaming_text`` None = the official wrapper default (False for voice clones, True for
    CustomVoice and VoiceDesign).
    """
    if non_streaming_text is None:
        non_streaming_text = mode.kind in ("custom_voice", "voice_design")
    role, body, ref_body, instruct_ids = _tokenize(tokenizer, text, mode, _instruct(config, mode))
    return _layout(config, mode, role, body, ref_body, instruct_ids, bool(non_streaming_text))


@dataclass(frozen=True)
class TextStream:
    """How the streaming text layout consumes a body that is still arriving (``stream_text``).

    The text ids form one stream ``prefix + body + [tts_eos]``: the prefill takes its first
    ``prefill`` ids (padded with ``tts_pad`` when the stream is shorter), each decode step ``s``
    takes id ``prefill + s``, and ``tts_pad`` follows the stream.
    """

    prefix: tuple  # ids before the body: the ICL reference text, else none
    prefill: int  # ids of the stream inside the prefill: 1, or 1 + reference frames with ICL
    eos_id: int
    pad_id: int

    @property
    def body_needed(self) -> int:
        """Final body ids needed before the prefill can run (without the end of the text)."""
        return max(1, self.prefill - len(self.prefix))


def text_stream(config, tokenizer, mode: Mode) -> TextStream:
    """The :class:`TextStream` of a resolved ``mode`` (the streaming text layout)."""
    prefix: list[int] = []
    prefill = 1
    if mode.icl:
        prefix = tokenizer.encode(f"<|im_start|>assistant\n{mode.ref_text}<|im_end|>\n")[3:-2]
        prefill = 1 + len(mode.ref_codes)
    return TextStream(tuple(prefix), prefill, int(config.tts_eos_token_id), int(config.tts_pad_token_id))


def live_prompt(config, tokenizer, mode: Mode, body: list[int]) -> Prompt:
    """The streaming-layout prompt whose prefill holds ``body``'s first ids (``TextStream``).

    ``body`` is the final part of a text that may still grow; only the ids that land in the
    prefill matter (the trailing ids come from the caller), and they equal :func:`build_prompt`'s
    for any text that starts with ``body``.
    """
    if not body:
        raise _empty("the text")
    role = tokenizer.encode("<|im_start|>assistant\n")[:3]
    ref_body = list(text_stream(config, tokenizer, mode).prefix) if mode.icl else None
    instruct = _instruct(config, mode)
    instruct_ids = tokenizer.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n") if instruct else []
    return _layout(config, mode, role, list(body), ref_body, instruct_ids, False)


def _layout(config, mode: Mode, role, body, ref_body, instruct_ids, non_streaming_text: bool) -> Prompt:
    rows = _Rows()
    for tok in list(instruct_ids) + list(role):
        rows.add(tok)
    speaker_codec = config.talker.speaker_token(mode.speaker) if mode.speaker else None
    lang_id = _language_id(config, mode.language, mode.speaker)
    _add_prefix(rows, config, _codec_prefix(config, lang_id, speaker_codec, mode.xvector is not None))
    codes = mode.ref_codes if mode.icl else np.zeros((0, NUM_CODEBOOKS), np.int64)
    if mode.icl:
        trailing = _body_icl(rows, config, ref_body, body, len(codes), non_streaming_text)
    else:
        trailing = _body_plain(rows, config, body, non_streaming_text)

    def arr(x):
        return np.asarray(x, dtype=np.int64)

    return Prompt(
        text_ids=arr(rows.text), codec_ids=arr(rows.codec), speaker_pos=rows.speaker_pos,
        icl_codes=codes, icl_frame=arr(rows.frame), trailing_text_ids=arr(trailing), mode=mode.kind,
        language=mode.language, non_streaming_text=non_streaming_text, text_token_count=len(body),
        tts_pad_id=int(config.tts_pad_token_id), speaker=mode.speaker,
    )
