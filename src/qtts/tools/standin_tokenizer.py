"""A byte-level stand-in for the Qwen2 text tokenizer, so random snapshots work without the real files.

It is a BPE model with the 256 byte-level symbols and no merges: every UTF-8 byte becomes one
token. The byte symbols sit at the ids the real Qwen2 vocabulary gives them (0..255, in GPT-2
``bytes_to_unicode`` order), the vocabulary is padded with unreachable filler entries up to
151643, and every added/special token of ``tokenizer_config.json`` sits at its real id
(151643..151675), so prompt templates produce the real special ids. Written as ``tokenizer.json``,
which both ``tokenizers`` and transformers' ``Qwen2TokenizerFast`` load.
"""

from __future__ import annotations

import os
import re

from ..text.tokenizer import QWEN2_PATTERN, added_token


def byte_symbols() -> list[str]:
    """GPT-2 byte-to-unicode symbols in vocabulary order (the first 256 ids of the Qwen2 vocab)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, n = [chr(b) for b in printable], 0
    for b in range(256):
        if b not in printable:
            chars.append(chr(256 + n))
            n += 1
    return chars


def write_standin_tokenizer(out_dir: str, tokenizer_config: dict) -> str:
    """Write ``tokenizer.json`` into ``out_dir``; ``tokenizer_config`` is the real ``tokenizer_config.json`` dict."""
    import tokenizers as tk

    added = sorted(
        ((int(i), t) for i, t in tokenizer_config.get("added_tokens_decoder", {}).items()), key=lambda x: x[0]
    )
    first_added = added[0][0] if added else 256
    vocab = {c: i for i, c in enumerate(byte_symbols())}
    for i in range(len(vocab), first_added):
        vocab[f"<|qtts_filler_{i}|>"] = i
    model = tk.models.BPE(
        vocab=vocab, merges=[], dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False
    )
    tok = tk.Tokenizer(model)
    tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = tk.decoders.ByteLevel()
    for idx, spec in added:
        token = added_token(spec, default_special=True)
        got = tok.add_tokens([token]) if not spec.get("special", True) else tok.add_special_tokens([token])
        if got != 1 or tok.token_to_id(spec["content"]) != idx:
            raise RuntimeError(f"stand-in tokenizer: {spec['content']} did not land at id {idx}")
    path = os.path.join(out_dir, "tokenizer.json")
    try:
        tok.save(path)
    except Exception as exc:  # tokenizers raises a plain Exception "... (os error 28)" for I/O errors
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), path) from None
    return path
