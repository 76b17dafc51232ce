"""What a Wyoming client may ask for: voices, languages, and the ``describe`` answer.

Voices by checkpoint: CustomVoice -> its speakers; Base -> the saved ``.voice`` files of the
voices directory (``qtts voice create``; regular files only: symlinks are neither listed nor
followed, and a file changed on disk is read again, :mod:`qtts.voice.folder`); VoiceDesign -> one voice, ``design``, speaking with the
server's ``--instruct``. Languages are advertised as ISO 639-1 codes (what Home Assistant
matches a pipeline language against); a request may send a code (``en``, ``en_US``, ``en-GB``),
a model language name (``english``, ``sichuan_dialect``) or ``auto``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

from ..errors import InputError
from ..version import __version__
from ..voice.folder import VoiceFileCache, regular_entries
from ..voice.store import SUFFIX, is_voice_id

log = logging.getLogger(__name__)

#: model language name -> ISO 639-1 code (the dialects are Chinese)
LANGUAGE_CODES = {
    "chinese": "zh", "english": "en", "german": "de", "italian": "it", "portuguese": "pt",
    "spanish": "es", "japanese": "ja", "korean": "ko", "french": "fr", "russian": "ru",
    "beijing_dialect": "zh", "sichuan_dialect": "zh",
}  # fmt: skip
DESIGN_VOICE = "design"
MODEL_URL = "https://github.com/QwenLM/Qwen3-TTS"


class VoiceNotFound(InputError):
    """A requested voice the catalog does not have (the message lists the known ones)."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """What one request resolves to: the arguments of ``TTS.stream`` besides the text."""

    voice_name: str
    speaker: str | None = None
    voice_path: str | None = None
    instruct: str | None = None
    language: str = "auto"


class Catalog:
    """Voices and languages of one engine (+ a voices directory); thread-safe voice cache."""

    def __init__(self, engine, voices_dir: str | None = None, default_voice: str | None = None,
                 language: str = "auto", instruct: str | None = None):
        self.engine = engine
        self.model_type = str(getattr(engine, "model_type", "base"))
        self.voices_dir = os.path.realpath(voices_dir) if voices_dir else None
        self.instruct = instruct or None
        self.language = self.model_language(language)
        self._cache = VoiceFileCache()
        names = self.voice_names()
        if not names:
            raise InputError(self._no_voice_hint())
        if default_voice is not None and default_voice not in names:
            raise VoiceNotFound(f"--voice {default_voice!r} is not one of this server's voices: {', '.join(names)}")
        self.default_voice = default_voice or names[0]

    # -- voices -------------------------------------------------------------------------------
    def voice_names(self) -> list[str]:
        """The voices a client may name (listed in ``describe``), sorted."""
        if self.model_type == "custom_voice":
            return sorted(str(s) for s in getattr(self.engine, "speakers", []) or [])
        if self.model_type == "voice_design":
            return [DESIGN_VOICE] if self.instruct else []
        if not self.voices_dir or not os.path.isdir(self.voices_dir):
            return []
        return [stem for stem, _ in regular_entries(self.voices_dir, SUFFIX) if is_voice_id(stem)]  # the store's ids

    def _no_voice_hint(self) -> str:
        if self.model_type == "voice_design":
            return "a VoiceDesign checkpoint speaks from a description: pass --instruct 'A calm, deep voice.'"
        if self.model_type == "base":
            where = f"no .voice files in {self.voices_dir}" if self.voices_dir else "no --voices DIR given"
            return (f"a Base checkpoint needs a saved voice ({where}); make one with "
                    "'qtts voice create me.wav --model M -o DIR/me.voice' and pass --voices DIR")
        return f"the checkpoint ({self.model_type}) has no speakers"

    def resolve(self, name: str | None = None, speaker: str | None = None, language: str | None = None) -> Choice:
        """The Choice for a request's voice fields; VoiceNotFound / InputError naming what is valid."""
        for what, value in (("name", name), ("speaker", speaker), ("language", language)):
            if value is not None and not (isinstance(value, str) and len(value) <= 256):
                raise InputError(f"the voice's {what!r} must be a string of at most 256 characters")
        names = self.voice_names()
        by_lower = {n.lower(): n for n in names}
        shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
        name = name or self.default_voice
        if speaker:
            if self.model_type == "custom_voice" and speaker.lower() in by_lower:
                name = speaker  # a multi-speaker voice's speaker field, as piper clients send it
            elif speaker.lower() != name.lower():
                raise VoiceNotFound(f"unknown speaker {speaker[:80]!r}; this server's voices are: {shown}")
        match = by_lower.get(name.lower())
        if match is None:
            raise VoiceNotFound(f"unknown voice {name[:80]!r}; this server has: {shown}")
        lang = self.model_language(language) if language else self.language
        if self.model_type == "custom_voice":
            return Choice(match, speaker=match, instruct=self.instruct, language=lang)
        if self.model_type == "voice_design":
            return Choice(match, instruct=self.instruct, language=lang)
        return Choice(match, voice_path=os.path.join(self.voices_dir, match + SUFFIX), language=lang)

    def load_voice(self, choice: Choice):
        """The :class:`qtts.Voice` of a Base choice (cached by file identity), else None;
        InputError when the file is gone, a symlink or not a voice."""
        if choice.voice_path is None:
            return None
        return self._cache.load(choice.voice_path)

    # -- languages ----------------------------------------------------------------------------
    def model_languages(self) -> list[str]:
        return [str(x) for x in getattr(self.engine, "languages", []) or ["auto"]]

    def codes(self) -> list[str]:
        """ISO codes of the model's languages (advertised in ``describe``)."""
        return sorted({LANGUAGE_CODES[x] for x in self.model_languages() if x in LANGUAGE_CODES})

    def model_language(self, language: str | None) -> str:
        """A request's language (code, model name or 'auto') -> the model's language name."""
        known = self.model_languages()
        text = (language or "auto").strip().lower()
        if text in known:
            return text
        code = re.split(r"[-_]", text, maxsplit=1)[0]
        for name in known:
            if LANGUAGE_CODES.get(name) == code and not name.endswith("_dialect"):
                return name
        codes = ", ".join(self.codes())
        raise InputError(f"unknown language {language!r}; use auto, a code ({codes}) or one of: "
                         f"{', '.join(known)}")

    # -- describe -----------------------------------------------------------------------------
    def info(self, streaming: bool = True):
        """The ``info`` event answering ``describe`` (a wyoming.info.Info)."""
        from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

        attribution = Attribution(name="Qwen (Alibaba Cloud)", url=MODEL_URL)
        size = getattr(self.engine, "model_size", "")
        model = f"Qwen3-TTS-12Hz {size} {self.model_type}".replace("  ", " ").strip()
        voices = [
            TtsVoice(name=n, description=self._describe_voice(n), attribution=attribution, installed=True,
                     version=None, languages=self.codes())
            for n in self.voice_names()
        ]
        program = TtsProgram(name="qtts", description=f"qtts ({model})", attribution=attribution,
                             installed=True, version=__version__, voices=voices,
                             supports_synthesize_streaming=streaming)
        return Info(tts=[program])

    def _describe_voice(self, name: str) -> str:
        if self.model_type == "voice_design":
            return f"designed voice: {self.instruct}"[:200]
        if self.model_type == "custom_voice":
            return f"{name} (speaker)"
        return f"{name} (saved voice)"
