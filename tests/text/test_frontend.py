"""Text frontend: tokenizer ids equal the official tokenizer; sentence splitting invariants."""

from __future__ import annotations

import json
import re
import shutil
import unicodedata
from pathlib import Path

import pytest

from conftest import REAL_TOKENIZER_DIR, reference_configs
from qtts.errors import ConfigError
from qtts.text.sentences import pack_sentences, split_sentences
from qtts.text.tokenizer import TextTokenizer, official_regex
from support.corpus import corpus

TOK_DIR = Path(REAL_TOKENIZER_DIR)
BASE_DIR = Path(reference_configs("Qwen3-TTS-12Hz-0.6B-Base"))

@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory) -> Path:
    """Text-tokenizer files + the real 0.6B-Base config.json, as in a downloaded snapshot."""
    d = tmp_path_factory.mktemp("snap")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(TOK_DIR / name, d / name)
    for name in ("config.json", "preprocessor_config.json"):
        shutil.copy(BASE_DIR / name, d / name)
    return d


@pytest.fixture(scope="module")
def official_processor(snapshot_dir):
    """The tokenizer exactly as Qwen3TTSModel.from_pretrained builds it (AutoProcessor, fix_mistral_regex)."""
    from support import official

    official.qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSProcessor
    from transformers import AutoConfig, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    return AutoProcessor.from_pretrained(str(snapshot_dir), fix_mistral_regex=True)


@pytest.fixture(scope="module")
def ours(snapshot_dir) -> TextTokenizer:
    return TextTokenizer.from_dir(str(snapshot_dir))


def test_corpus_size_and_coverage():
    lines = corpus()
    assert len(lines) >= 200
    text = "".join(lines)
    for ch in "你こ안äèãñçж😀\u200b\u202e\u0301。！？":
        assert ch in text
    assert any(x != x.strip() for x in lines) and any("\n" in x for x in lines)


def test_official_regex_rule(snapshot_dir):
    assert official_regex(str(snapshot_dir)) == "fixed"  # real snapshots say transformers 4.57.3
    assert official_regex(str(TOK_DIR)) == "qwen2"  # no config.json: transformers keeps Qwen2's


@pytest.mark.parity
@pytest.mark.parametrize("config", [
    {"transformers_version": "4.57.1", "model_type": "qwen3_tts"},
    {"transformers_version": "4.57.1", "model_type": "mistral"},
    {"transformers_version": "4.57.3", "model_type": "qwen3_tts"},
    {"transformers_version": "5.0.0", "model_type": "qwen3_tts"},
    {"model_type": "qwen3_tts"},
])
def test_regex_rule_matches_transformers(tmp_path, config):
    from transformers import AutoTokenizer

    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(TOK_DIR / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    ref = AutoTokenizer.from_pretrained(str(tmp_path), fix_mistral_regex=True)
    pre = json.loads(ref.backend_tokenizer.to_str())["pre_tokenizer"]["pretokenizers"][0]
    patched = "(?i:'s" not in pre["pattern"]["Regex"]
    assert official_regex(str(tmp_path)) == ("fixed" if patched else "qwen2")


@pytest.mark.parity
def test_ids_equal_official_processor(official_processor, ours):
    assert ours.regex == "fixed"
    tok = official_processor.tokenizer
    for line in corpus():
        want = tok(line)["input_ids"]
        assert ours.encode(line) == want, repr(line)
        assert ours.decode(want) == tok.decode(want), repr(line)
        assert ours.decode(want) == unicodedata.normalize("NFC", line), repr(line)


@pytest.mark.parity
def test_chat_strings_equal_official_processor(official_processor, ours):
    """The three strings the official wrapper tokenizes, through the processor itself."""
    for line in corpus():
        for s in (
            f"<|im_start|>assistant\n{line}<|im_end|>\n<|im_start|>assistant\n",
            f"<|im_start|>assistant\n{line}<|im_end|>\n",
            f"<|im_start|>user\n{line}<|im_end|>\n",
        ):
            want = official_processor(text=s, return_tensors="pt", padding=True)["input_ids"][0].tolist()
            assert ours.encode(s) == want, repr(s)


@pytest.mark.parity
def test_plain_qwen2_dir_equals_transformers():
    """Without config.json transformers keeps the Qwen2 regex; so do we (and the regex matters)."""
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(TOK_DIR), fix_mistral_regex=True)
    ours = TextTokenizer.from_dir(str(TOK_DIR))
    fixed = TextTokenizer.from_dir(str(TOK_DIR), regex="fixed")
    assert ours.regex == "qwen2"
    differs = 0
    for line in corpus():
        assert ours.encode(line) == ref(line)["input_ids"], repr(line)
        differs += fixed.encode(line) != ours.encode(line)
    assert differs > 0  # the corpus tells the two regexes apart ("iPhone", combining marks)


@pytest.mark.parity
def test_tokenizer_json_snapshot(tmp_path, snapshot_dir):
    """A snapshot that ships tokenizer.json loads from it and gets the same regex patch."""
    from transformers import AutoTokenizer

    ref_plain = AutoTokenizer.from_pretrained(str(TOK_DIR))
    ref_plain.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    for name in ("tokenizer_config.json", "config.json"):
        shutil.copy(snapshot_dir / name, tmp_path / name)
    ref = AutoTokenizer.from_pretrained(str(tmp_path), fix_mistral_regex=True)
    ours = TextTokenizer.from_dir(str(tmp_path))
    assert ours.regex == "fixed"
    for line in corpus()[::3]:
        assert ours.encode(line) == ref(line)["input_ids"], repr(line)


def test_special_tokens_are_single_ids(ours):
    cfg = json.loads((TOK_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    for idx, spec in cfg["added_tokens_decoder"].items():
        assert ours.encode(spec["content"]) == [int(idx)]
        assert ours.encode(f"a{spec['content']}b")[1] == int(idx)
    assert ours.encode("<|im_start|>assistant\n") == [151644, 77091, 198]
    assert ours.encode("<|im_start|>assistant\n\n") == [151644, 77091, 271]  # the leading-newline quirk


@pytest.mark.parity
def test_standin_tokenizer_json_snapshot(tiny_snapshot):
    """The byte-level stand-in tokenizer.json of test snapshots loads and matches transformers."""
    from transformers import AutoTokenizer

    path = tiny_snapshot(kind="base", real_tokenizer=False)
    ref = AutoTokenizer.from_pretrained(path, fix_mistral_regex=True)
    ours = TextTokenizer.from_dir(path)
    for line in corpus()[::5]:
        assert ours.encode(line) == ref(line)["input_ids"], repr(line)


def test_bad_dir_and_bad_regex(tmp_path):
    with pytest.raises(ConfigError, match="vocab.json"):
        TextTokenizer.from_dir(str(tmp_path))
    with pytest.raises(ConfigError, match="regex"):
        TextTokenizer.from_dir(str(TOK_DIR), regex="gpt2")


# --- sentence splitting ------------------------------------------------------------------

def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


PARAGRAPHS = [
    "Dr. Smith went home at 3.30 p.m. He said: \"Hi!\" Then he left. What a day! Really?",
    "今天天气很好。我们去公园吧！你觉得呢？好的；走吧……",
    "こんにちは。今日はいい天気ですね！散歩に行きませんか？",
    "안녕하세요. 오늘 날씨가 좋네요! 산책할까요?",
    "Guten Tag. Wie geht es Ihnen? Mir geht es gut, danke!",
    "Привет. Как дела? Всё хорошо!",
    "¡Hola! ¿Cómo estás? Muy bien.",
    "Bonjour. Comment ça va ? Très bien !",
    "Olá. Tudo bem? Sim!",
    "Ciao. Come stai? Bene!",
]


@pytest.mark.parametrize("text", PARAGRAPHS + corpus()[::7])
@pytest.mark.parametrize("max_chars", [8, 20, 200])
def test_split_keeps_all_text(text, max_chars):
    pieces = split_sentences(text, max_chars=max_chars)
    assert _squash("".join(pieces)) == _squash(text)
    for p in pieces:
        assert p and p == p.strip() and len(p) <= max_chars


def test_split_sentence_boundaries():
    assert split_sentences(PARAGRAPHS[1], min_chars=1) == [
        "今天天气很好。", "我们去公园吧！", "你觉得呢？", "好的；", "走吧……"]
    assert split_sentences("First sentence here. Second sentence here! Third one here?", min_chars=1) == [
        "First sentence here.", "Second sentence here!", "Third one here?"]
    # abbreviations, initials and decimals are not sentence ends; closing quotes stay attached
    assert split_sentences('Dr. J. Smith paid 3.50 dollars. "Fine!" he said.', min_chars=1) == [
        "Dr. J. Smith paid 3.50 dollars.", '"Fine!"', "he said."]
    assert split_sentences("line one\nline two\n\nline three", min_chars=1) == [
        "line one", "line two", "line three"]


def test_split_merges_tiny_pieces_and_hard_splits():
    assert split_sentences("Hi. Yes. This is a longer sentence.", min_chars=12) == [
        "Hi. Yes. This is a longer sentence."]
    long = "one, two, three, four, five, six, seven, eight"
    assert split_sentences(long, max_chars=20) == ["one, two, three,", "four, five, six,", "seven, eight"]
    words = "alpha beta gamma delta epsilon zeta eta theta"
    assert all(len(p) <= 12 for p in split_sentences(words, max_chars=12))
    emoji = "👨‍👩‍👧‍👦🇨🇳🇺🇸👍🏽❤️e\u0301" * 4
    pieces = split_sentences(emoji, max_chars=9)
    assert "".join(pieces) == emoji
    assert all(p[0] not in "\u200d\u0301\ufe0f\U0001f3fd" and p[-1] != "\u200d" for p in pieces)
    flags = split_sentences("🇨🇳" * 9, max_chars=8)
    assert all(len(p) % 2 == 0 for p in flags) and "".join(flags) == "🇨🇳" * 9
    cjk = "中" * 50
    assert split_sentences(cjk, max_chars=20) == ["中" * 20, "中" * 20, "中" * 10]
    assert split_sentences("", max_chars=20) == [] and split_sentences(" \n ", max_chars=20) == []


@pytest.mark.parametrize("text", list(PARAGRAPHS) + ["Hi. Yes. This is a longer sentence.", "中" * 50])
@pytest.mark.parametrize("max_chars", [8, 20, 60, 200])
def test_pack_sentences_packs_whole_sentences(text, max_chars):
    """Pieces keep all the text, fit max_chars, end where split_sentences cuts, and no two neighbours
    fit together; a text that fits is one piece (what TTS.stream speaks without splitting)."""
    pieces = pack_sentences(text, max_chars)
    assert _squash("".join(pieces)) == _squash(text)
    assert all(p and p == p.strip() and len(p) <= max_chars for p in pieces)
    assert all(len(f"{a} {b}") > max_chars for a, b in zip(pieces, pieces[1:]))
    cuts = split_sentences(text, max_chars=max_chars, min_chars=1)
    ends = {len(_squash("".join(cuts[: i + 1]))) for i in range(len(cuts))}
    assert all(len(_squash("".join(pieces[: i + 1]))) in ends for i in range(len(pieces)))
    if len(text.strip()) <= max_chars:
        assert pieces == [text.strip()]


def test_a_directory_loads_once_until_its_files_change(tmp_path):
    """from_dir hands back the instance it built for the same files and regex; a rewritten
    tokenizer_config.json or a "#version" merges header (as in HF snapshots) builds anew, with
    the same ids as the plain files."""
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(TOK_DIR / name, tmp_path / name)
    first = TextTokenizer.from_dir(str(tmp_path))
    assert TextTokenizer.from_dir(str(tmp_path)) is first
    assert TextTokenizer.from_dir(str(tmp_path), regex="fixed") is not first
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\n" + merges.read_text(encoding="utf-8"), encoding="utf-8")
    again = TextTokenizer.from_dir(str(tmp_path))
    assert again is not first and [again.encode(line) for line in corpus()] == [first.encode(line) for line in corpus()]
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    idx, spec = next(iter(cfg["added_tokens_decoder"].items()))
    cfg["added_tokens_decoder"][str(int(idx) + 1)] = cfg["added_tokens_decoder"].pop(idx)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(ConfigError, match="added token"):  # the changed file is read, not the kept one
        TextTokenizer.from_dir(str(tmp_path))
