"""Text frontend: the Qwen2 byte-level BPE tokenizer (``tokenizers``) and sentence splitting.

:class:`TextTokenizer` gives the same ids as the tokenizer the official wrapper uses, i.e.
``AutoProcessor.from_pretrained(snapshot, fix_mistral_regex=True).tokenizer`` (transformers
4.57.3 ``Qwen2TokenizerFast`` converted from ``vocab.json`` + ``merges.txt``):

* NFC normalizer; added/special tokens from ``tokenizer_config.json`` matched as whole tokens
  in the raw text (``normalized=False``) at their configured ids;
* pre-tokenization = a regex ``Split`` (isolated) followed by ``ByteLevel`` without prefix
  space and without its own regex; ByteLevel decoder.

Which regex: transformers 4.57.3 replaces the Qwen2 regex by its "fixed Mistral" regex when
``fix_mistral_regex=True`` is passed (the official wrapper passes it) **and** the snapshot's
``config.json`` looks affected: ``transformers_version`` in (4.57.2, 5.0.0), or an older
version with a Mistral model type, or no version at all. Every published Qwen3-TTS snapshot
says 4.57.3, so the official tokenizer of a real snapshot uses :data:`FIXED_PATTERN`; a
directory without ``config.json`` keeps :data:`QWEN2_PATTERN`. ``from_dir(regex="auto")``
applies the same rule (see docs/text.md).
"""

from __future__ import annotations

import json
import logging
import os
import re
import unicodedata

from .errors import ConfigError, require

log = logging.getLogger(__name__)

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
FIXED_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_MISTRAL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def official_regex(path: str) -> str:
    """'fixed' or 'qwen2': the regex transformers 4.57.3 uses for this dir with fix_mistral_regex=True."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        return "qwen2"
    with open(cfg_path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    version, model_type = cfg.get("transformers_version"), cfg.get("model_type")
    if version and _version(version) <= (4, 57, 2):
        if model_type is not None and model_type not in _MISTRAL_TYPES:
            return "qwen2"
    elif version and _version(version) >= (5, 0, 0):
        return "qwen2"
    return "fixed"


def _read_merges(path: str) -> list[tuple[str, str]]:
    merges = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            line = line.strip()
            if (i == 0 and line.startswith("#version:")) or not line:
                continue
            merges.append(tuple(line.split()))
    return merges


def added_token(spec: dict, default_special: bool = False):
    """A ``tokenizers.AddedToken`` from one ``added_tokens_decoder`` entry of tokenizer_config.json."""
    tk = require("tokenizers", "core", "the text tokenizer")
    return tk.AddedToken(
        spec["content"],
        single_word=spec.get("single_word", False),
        lstrip=spec.get("lstrip", False),
        rstrip=spec.get("rstrip", False),
        normalized=spec.get("normalized", False),
        special=spec.get("special", default_special),
    )


def _added_tokens(path: str):
    """(id, AddedToken) pairs from tokenizer_config.json's added_tokens_decoder, sorted by id."""
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(cfg_path):
        return []
    with open(cfg_path, encoding="utf-8") as fh:
        decoder = json.load(fh).get("added_tokens_decoder", {})
    return [(int(idx), added_token(spec)) for idx, spec in sorted(decoder.items(), key=lambda kv: int(kv[0]))]


def _split(pattern: str):
    tk = require("tokenizers", "core", "the text tokenizer")
    return tk.pre_tokenizers.Split(tk.Regex(pattern), behavior="isolated", invert=False)


def _build_bpe(path: str, pattern: str):
    tk = require("tokenizers", "core", "the text tokenizer")
    with open(os.path.join(path, "vocab.json"), encoding="utf-8") as fh:
        vocab = json.load(fh)
    model = tk.models.BPE(
        vocab=vocab,
        merges=_read_merges(os.path.join(path, "merges.txt")),
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = tk.Tokenizer(model)
    tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [_split(pattern), tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = tk.decoders.ByteLevel()
    tok.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    return tok


class TextTokenizer:
    """Text -> Qwen2 token ids, equal to the official processor's tokenizer."""

    def __init__(self, tokenizer, regex: str = "qwen2", source: str | None = None):
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer
        self.regex = regex
        self.source = source

    @classmethod
    def from_dir(cls, path: str, regex: str = "auto") -> TextTokenizer:
        """Load from a snapshot dir; ``regex`` is 'auto' (official rule), 'fixed' or 'qwen2'."""
        if regex not in ("auto", "fixed", "qwen2"):
            raise ConfigError(f"regex must be 'auto', 'fixed' or 'qwen2', got {regex!r}")
        tk = require("tokenizers", "core", "the text tokenizer")
        chosen = official_regex(path) if regex == "auto" else regex
        pattern = FIXED_PATTERN if chosen == "fixed" else QWEN2_PATTERN
        tok_json = os.path.join(path, "tokenizer.json")
        if os.path.isfile(tok_json):
            tok = tk.Tokenizer.from_file(tok_json)
            if chosen == "fixed" and isinstance(tok.pre_tokenizer, tk.pre_tokenizers.Sequence):
                tok.pre_tokenizer[0] = _split(pattern)  # what transformers patches
        elif os.path.isfile(os.path.join(path, "vocab.json")):
            tok = _build_bpe(path, pattern)
        else:
            raise ConfigError(
                f"{path}: no tokenizer.json or vocab.json + merges.txt; pass a Qwen3-TTS snapshot directory"
            )
        for idx, token in _added_tokens(path):
            existing = tok.token_to_id(token.content)
            if existing is None:
                tok.add_tokens([token])
                existing = tok.token_to_id(token.content)
            if existing != idx:
                raise ConfigError(
                    f"{path}: added token {token.content!r} got id {existing}, tokenizer_config.json says {idx}"
                )
        log.debug("text tokenizer from %s (regex %s)", path, chosen)
        return cls(tok, regex=chosen, source=path)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings such as '<|im_end|>' become one id."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """(ids, start character offset of each id in ``text``), for incremental tokenization."""
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return list(enc.ids), [s for s, _ in enc.offsets]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)


# ---------------------------------------------------------------------------------------
# Sentence splitting for long text

_CLOSERS = "\"'”’»」』》】）)]"
# CJK / full-width terminators end a sentence anywhere; ASCII ones only before a space or the end.
_SENTENCE_END = re.compile(
    rf"[。！？；．｡‼⁇⁈⁉]+[{re.escape(_CLOSERS)}]*|[.!?…]+[{re.escape(_CLOSERS)}]*(?=\s|$)"
)
_CLAUSE_END = re.compile(r"[,，、;；:：—–]+|\s-\s")
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "z.b", "bzw",
    "usw", "nr", "no", "sra", "srta", "dra", "ca", "approx", "fig", "vol",
}


def _is_abbreviation(text: str, end: int) -> bool:
    """True when the single '.' ending at ``end`` belongs to an abbreviation or an initial."""
    if text[end - 1] != "." or (end >= 2 and text[end - 2] in ".!?…"):
        return False
    word = re.search(r"[\w.]*$", text[: end - 1]).group(0).lower()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    """Spans of sentences: ends after terminators (plus closing quotes) and at line breaks."""
    cuts = {0, len(text)}
    for m in re.finditer(r"\n+", text):
        cuts.add(m.end())
    for m in _SENTENCE_END.finditer(text):
        if not _is_abbreviation(text, m.end()):
            cuts.add(m.end())
    edges = sorted(cuts)
    return [(a, b) for a, b in zip(edges, edges[1:]) if text[a:b].strip()]


def sentence_end(text: str, lo: int, hi: int) -> int | None:
    """The first sentence end ``e`` with ``lo <= e < hi`` (``hi < len(text)``) by the rules of
    :func:`split_sentences`. It reads only ``text[:hi + 1]``, so for a text that is still growing
    the answer is already final."""
    start = max(0, lo - 64)  # a terminator run and an abbreviation look back a little
    ends = [start + m.end() for m in re.finditer(r"\n+", text[start : hi + 1])]
    ends += [m.end() for m in _SENTENCE_END.finditer(text, start, hi + 1) if not _is_abbreviation(text, m.end())]
    ends = [e for e in ends if lo <= e < hi]
    return min(ends) if ends else None


def _joined(text: str, i: int) -> bool:
    """True when a cut between text[i-1] and text[i] would split one user-perceived character."""
    ch, prev = text[i], text[i - 1]
    if unicodedata.category(ch) in ("Mn", "Me", "Mc") or "\u200d" in (ch, prev):
        return True
    if "\ufe00" <= ch <= "\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff":  # variation selector, skin tone
        return True
    regional = "\U0001f1e6" <= ch <= "\U0001f1ff" and "\U0001f1e6" <= prev <= "\U0001f1ff"
    return regional and (len(re.search("[\U0001f1e6-\U0001f1ff]*$", text[:i]).group(0)) % 2 == 1)


def _hard_cut(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Cut [start, end) into spans <= max_chars: at clause marks, else spaces, else anywhere."""
    spans = []
    while end - start > max_chars:
        limit = start + max_chars
        window = text[start:limit]
        cut = max((m.end() for m in _CLAUSE_END.finditer(window)), default=0)
        if cut == 0:
            cut = max((m.start() + 1 for m in re.finditer(r"\s", window)), default=0)
        if cut == 0:
            cut = max_chars
            while cut > 1 and _joined(text, start + cut):
                cut -= 1  # never split a character from its marks, or an emoji sequence
        spans.append((start, start + cut))
        start += cut
    spans.append((start, end))
    return spans


def split_sentences(text: str, max_chars: int = 200, min_chars: int = 12) -> list[str]:
    """Split ``text`` into stripped pieces of at most ``max_chars`` characters.

    Cuts after sentence terminators (ASCII . ! ? … before a space; CJK 。！？；．anywhere;
    closing quotes stay with their sentence) and at line breaks; abbreviations such as "Dr."
    and initials are not cut. Pieces shorter than ``min_chars`` are merged into a neighbour
    (while the result fits ``max_chars``); longer pieces are cut at commas/colons/dashes,
    then spaces, then anywhere. No text is dropped: the pieces, joined, equal ``text``
    without the whitespace at the cut points.
    """
    if max_chars < 8:
        raise ValueError(f"max_chars must be >= 8, got {max_chars}")
    spans: list[tuple[int, int]] = []
    for a, b in _sentence_spans(text):
        spans.extend(_hard_cut(text, a, b, max_chars))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged:
            pa, pb = merged[-1]
            small = len(text[pa:pb].strip()) < min_chars or len(text[a:b].strip()) < min_chars
            if small and len(text[pa:b].strip()) <= max_chars:
                merged[-1] = (pa, b)
                continue
        merged.append((a, b))
    return [p for p in (text[a:b].strip() for a, b in merged) if p]
