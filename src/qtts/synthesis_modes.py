"""Which conditioning a call asks for, checked against what the checkpoint supports.

| checkpoint     | valid conditioning                                   |
|----------------|------------------------------------------------------|
| Base           | ``voice`` (x-vector only, or ICL with reference text) |
| CustomVoice    | ``speaker`` (+ ``instruct`` on 1.7B)                  |
| VoiceDesign    | ``instruct``                                          |

Every mismatch is an :class:`~qtts.errors.InputError` that lists what is valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class Mode:
    kind: str  # 'xvector' | 'icl' | 'custom_voice' | 'voice_design'
    language: str
    speaker: str | None = None
    instruct: str | None = None

    @property
    def icl(self) -> bool:
        return self.kind == "icl"

    @property
    def xvector(self) -> bool:
        """True when the prompt's speaker slot takes the voice's x-vector (both clone modes)."""
        return self.kind in ("xvector", "icl")


def valid_conditioning(config) -> str:
    t = config.tts_model_type
    if t == "base":
        return "voice=<Voice or .voice file> (CLI: --voice V or --ref-audio A [--ref-text T])"
    if t == "custom_voice":
        extra = " and optionally instruct=..." if config.tts_model_size == "1b7" else ""
        return f"speaker=<one of: {', '.join(config.speakers)}>{extra}"
    return "instruct=<a description of the voice> (CLI: --instruct I)"


def _fail(config, problem: str):
    raise InputError(f"{problem}; this {config.tts_model_type} {config.tts_model_size} checkpoint takes "
                     f"{valid_conditioning(config)}")


def check_language(config, language: str | None) -> str:
    lang = (language or "auto").strip().lower()
    if lang not in config.languages:
        raise InputError(f"unknown language '{language}'; valid: {', '.join(config.languages)}")
    return lang


def resolve(config, voice, speaker: str | None, instruct: str | None, language: str | None) -> Mode:
    """The :class:`Mode` for these arguments, or an InputError that lists the valid ones."""
    lang = check_language(config, language)
    t = config.tts_model_type
    instruct = instruct.strip() if isinstance(instruct, str) and instruct.strip() else None
    if t == "base":
        if speaker:
            _fail(config, f"speaker '{speaker}' needs a CustomVoice checkpoint")
        if instruct:
            _fail(config, "instruct needs a VoiceDesign or 1.7B CustomVoice checkpoint")
        if voice is None:
            _fail(config, "a Base checkpoint clones a voice and needs one")
        voice.check_compatible(t, config.tts_model_size, config.talker.hidden_size)
        return Mode("icl" if voice.icl else "xvector", lang)
    if voice is not None:
        _fail(config, "voice cloning needs a Base checkpoint")
    if t == "custom_voice":
        if not speaker:
            _fail(config, "no speaker given")
        name = speaker.strip().lower()
        if name not in config.speakers:
            raise InputError(f"unknown speaker '{speaker}'; valid: {', '.join(config.speakers)}")
        if instruct and config.tts_model_size != "1b7":
            _fail(config, "instruct needs the 1.7B CustomVoice (or VoiceDesign) checkpoint")
        return Mode("custom_voice", lang, speaker=name, instruct=instruct)
    if speaker:
        _fail(config, f"speaker '{speaker}' needs a CustomVoice checkpoint")
    if not instruct:
        _fail(config, "no instruct given")
    return Mode("voice_design", lang, instruct=instruct)
