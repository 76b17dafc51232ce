"""OpenAI voice names -> qtts voices: the alias table of ``POST /v1/audio/speech``.

An OpenAI client names one of OpenAI's voices (``alloy``, ``nova``, ...). The server resolves a
``voice`` in this order (docs/server.md, "Voices"):

1. an alias given with ``qtts serve --voice-alias NAME=VOICE`` (the operator's choice wins);
2. a built-in speaker of the model (CustomVoice checkpoints), then an uploaded voice id;
3. the default alias table below, whose targets are the nine speakers of the Qwen3-TTS
   CustomVoice checkpoints (an entry is used only when its target exists on the served model).

An OpenAI voice name that none of these resolves (a Base checkpoint with no ``--voice-alias``)
gets 400 ``voice_not_mapped`` listing the voices this server has and the flag that maps it.
"""

from __future__ import annotations

import re

from ..errors import InputError

#: voice ids as :data:`qtts.server.voices.VOICE_ID_RE` (not imported: this module loads without FastAPI)
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_voice_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None

#: OpenAI's built-in voice names (audio.speech and the Realtime API)
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")

#: default table for CustomVoice checkpoints: the timbre of each OpenAI voice, roughly (lower and
#: higher voices, female and male); English speakers first where OpenAI's voice is an English one
DEFAULT_ALIASES = {
    "alloy": "vivian", "ash": "ryan", "ballad": "aiden", "cedar": "ryan", "coral": "serena", "echo": "aiden",
    "fable": "aiden", "marin": "serena", "nova": "vivian", "onyx": "uncle_fu", "sage": "serena",
    "shimmer": "sohee", "verse": "dylan",
}  # fmt: skip


def parse_alias(text: str) -> tuple[str, str]:
    """``'alloy=vivian'`` -> ``('alloy', 'vivian')``; InputError naming the rule otherwise."""
    name, sep, target = text.partition("=")
    name, target = name.strip().lower(), target.strip()
    if not sep or not is_voice_id(name) or not is_voice_id(target):
        raise InputError(f"--voice-alias {text!r}: give NAME=VOICE (e.g. alloy=vivian), both 1-64 characters "
                         "of A-Z a-z 0-9 _ -")
    return name, target


def configured(aliases) -> dict[str, str]:
    """The ``--voice-alias`` pairs as a dict (names lower-case; a later pair wins)."""
    return {name.lower(): target for name, target in aliases}


def default_target(name: str, speakers: list[str]) -> str | None:
    """The default table's speaker for ``name``, when the model has that speaker."""
    target = DEFAULT_ALIASES.get(name.lower())
    return target if target is not None and target in {s.lower() for s in speakers} else None


def effective_table(aliases, speakers: list[str]) -> dict[str, str]:
    """Every alias this server answers: the defaults that apply to the model, then ``--voice-alias``."""
    table = {name: default_target(name, speakers) for name in DEFAULT_ALIASES}
    table = {k: v for k, v in table.items() if v is not None}
    table.update(configured(aliases))
    return dict(sorted(table.items()))
