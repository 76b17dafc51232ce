"""Word timings as files: SRT and WebVTT subtitles, and JSON (``qtts say --subtitles / --words-json``).

Cues group the words of one text piece in order, at most :data:`CUE_CHARS` characters and
:data:`CUE_SECONDS` seconds each; a piece never shares a cue with the next one. A cue's text is
the piece's own text from its first word to the next cue's first word (so punctuation the aligner
drops is shown); when a word cannot be found in the piece's text (the aligner's word split cleaned
it), the words themselves are joined. A "piece" timing (no aligner) is one cue with the whole
piece. Times are written to the millisecond; cues never overlap, and a cue left without time of its
own (the aligner put its words at one instant) joins the cue before it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import InputError
from ..files import temp_beside
from ..text.words import is_cjk

#: subtitle formats by extension
SUBTITLE_FORMATS = ("srt", "vtt")
CUE_CHARS = 42  # the common broadcast line length
CUE_SECONDS = 5.0


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    text: str


def subtitle_format(path: str) -> str:
    """``srt`` or ``vtt`` from the extension, or InputError naming both."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in SUBTITLE_FORMATS:
        raise InputError(f"--subtitles {path}: unknown subtitle format '.{ext}'; use a .srt or .vtt file")
    return ext


def _join(words) -> str:
    out = ""
    for w in words:
        glue = "" if not out or is_cjk(out[-1]) or is_cjk(w.text[0]) else " "
        out += glue + w.text
    return out


def _groups(words) -> list[list]:
    groups: list[list] = []
    for w in words:
        last = groups[-1] if groups else None
        if (last and last[-1].piece == w.piece and w.unit == "word" and last[-1].unit == "word"
                and len(_join(last + [w])) <= CUE_CHARS and w.end - last[0].start <= CUE_SECONDS):  # fmt: skip
            last.append(w)
        else:
            groups.append([w])
    return groups


def _texts(groups, pieces: dict[int, str]) -> list[str]:
    """Each group's text: the piece text from its first word to the next group's first word."""
    out, cursor = [], {}
    places = []
    for g in groups:
        text = pieces.get(g[0].piece)
        at = text.find(g[0].text, cursor.get(g[0].piece, 0)) if text else -1
        places.append(at)
        if at >= 0:
            cursor[g[0].piece] = at + len(g[0].text)
            for w in g[1:]:
                found = text.find(w.text, cursor[g[0].piece])
                cursor[g[0].piece] = found + len(w.text) if found >= 0 else cursor[g[0].piece]
    for i, g in enumerate(groups):
        text, at = pieces.get(g[0].piece), places[i]
        nxt = places[i + 1] if i + 1 < len(groups) and groups[i + 1][0].piece == g[0].piece else None
        if text is None or at < 0 or (nxt is not None and nxt < 0) or g[0].unit != "word":
            out.append(g[0].text if g[0].unit != "word" else _join(g))
        else:
            out.append(text[at : nxt if nxt is not None else len(text)].strip())
    return out


def cues(words, pieces: dict[int, str] | None = None) -> list[Cue]:
    """Subtitle cues of ``words`` (:class:`qtts.align.timing.WordTiming`); ``pieces``: piece index ->
    its text (punctuation for the cues), else the words are joined."""
    groups = _groups(list(words))
    texts = _texts(groups, pieces or {})
    out: list[Cue] = []
    for g, text in zip(groups, texts):
        start = round(max(g[0].start, out[-1].end if out else 0.0), 3)
        end = round(max(g[-1].end, start), 3)
        if end > start:
            out.append(Cue(start, end, text))
        elif out:  # no time of its own (the aligner put it at one instant): it joins the cue before
            out[-1] = Cue(out[-1].start, out[-1].end, f"{out[-1].text} {text}")
        else:
            out.append(Cue(start, round(start + 0.001, 3), text))
    return out


def _stamp(t: float, sep: str) -> str:
    ms = int(round(t * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(cue_list: list[Cue]) -> str:
    blocks = [f"{i}\n{_stamp(c.start, ',')} --> {_stamp(c.end, ',')}\n{c.text}\n" for i, c in enumerate(cue_list, 1)]
    return "\n".join(blocks)


def vtt(cue_list: list[Cue]) -> str:
    blocks = [f"{_stamp(c.start, '.')} --> {_stamp(c.end, '.')}\n{c.text}\n" for c in cue_list]
    return "WEBVTT\n\n" + "\n".join(blocks)


def words_json(words, unit: str) -> str:
    """``{"timestamps": "word"|"piece", "words": [{text, start, end, unit, piece}, ...]}``."""
    return json.dumps({"timestamps": unit, "words": [w.to_dict() for w in words]}, ensure_ascii=False, indent=1)


def write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, then rename it over ``path``."""
    tmp = temp_beside(path, ".part")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_subtitles(path: str, words, pieces: dict[int, str] | None = None) -> None:
    """``path`` as SRT or WebVTT by its extension."""
    fmt = subtitle_format(path)
    cue_list = cues(words, pieces)
    write_text(path, srt(cue_list) if fmt == "srt" else vtt(cue_list))
