"""The Qwen2 byte-level BPE text tokenizer (``tokenizers``); sentences are :mod:`qtts.text.sentences`.

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
import threading
from collections import OrderedDict

import tokenizers as tk

from ..errors import ConfigError

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


def added_token(spec: dict, default_special: bool = False):
    """A ``tokenizers.AddedToken`` from one ``added_tokens_decoder`` entry of tokenizer_config.json."""
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
    return tk.pre_tokenizers.Split(tk.Regex(pattern), behavior="isolated", invert=False)


def _build_bpe(path: str, pattern: str):
    # tokenizers reads vocab.json and merges.txt (a "#version" first line skipped) itself
    model = tk.models.BPE.from_file(
        os.path.join(path, "vocab.json"),
        os.path.join(path, "merges.txt"),
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


#: files whose contents decide a directory's tokenizer (the regex rule reads config.json)
_SOURCES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "config.json")
_LOADED: OrderedDict = OrderedDict()  # (dir, regex, file stats) -> TextTokenizer, newest last
_LOADED_MAX = 4
_LOADED_LOCK = threading.Lock()


def _files_key(path: str) -> tuple:
    """(name, size, mtime_ns) of each source file present: a changed file makes a new key."""
    key = []
    for name in _SOURCES:
        try:
            st = os.stat(os.path.join(path, name))
        except OSError:
            continue
        key.append((name, st.st_size, st.st_mtime_ns))
    return tuple(key)


class TextTokenizer:
    """Text -> Qwen2 token ids, equal to the official processor's tokenizer.

    Immutable once built: :meth:`from_dir` hands every caller in a process the same instance for
    the same unchanged files (building the 151k-entry BPE is the slow part of a load, and a server
    or a test run loads the same snapshot many times)."""

    def __init__(self, tokenizer, regex: str = "qwen2", source: str | None = None):
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer
        self.regex = regex
        self.source = source

    @classmethod
    def from_dir(cls, path: str, regex: str = "auto") -> TextTokenizer:
        """Load from a snapshot dir; ``regex`` is 'auto' (official rule), 'fixed' or 'qwen2'.

        The last few loaded are kept: the same directory with the same files (size and mtime) and
        ``regex`` returns the instance built before."""
        if regex not in ("auto", "fixed", "qwen2"):
            raise ConfigError(f"regex must be 'auto', 'fixed' or 'qwen2', got {regex!r}")
        key = (os.path.abspath(path), regex, _files_key(path))
        with _LOADED_LOCK:
            if key in _LOADED:
                _LOADED.move_to_end(key)
                return _LOADED[key]
        made = cls._build(path, regex)
        with _LOADED_LOCK:
            _LOADED[key] = made
            while len(_LOADED) > _LOADED_MAX:
                _LOADED.popitem(last=False)
        return made

    @classmethod
    def _build(cls, path: str, regex: str) -> TextTokenizer:
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
