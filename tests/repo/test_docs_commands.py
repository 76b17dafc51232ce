"""The docs a user reads cannot drift from the CLI: every ``qtts ...`` command in the shell code blocks
of README.md and docs/*.md (not docs/history/: dated runs keep the commands of their day) must parse
with ``qtts``'s own parser (the sub-command exists, every flag exists and takes the values shown),
and the pages stay within their line limits."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from qtts.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: the pages whose every command is checked (README.md and docs/performance.md are required to show some)
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))
MUST_SHOW = ("README.md", "docs/performance.md")
#: line limits of the pages a user reads (issue 37, deliverable 6)
LIMITS = {"README.md": 250, "docs/performance.md": 300, "docs/server.md": 400}
#: shell words that separate commands on one line
SEPARATORS = {"|", "||", "&&", ";"}
#: shell words that may stand before a command (``for ...; do qtts ...; done``, ``time qtts ...``)
PREFIXES = {"do", "then", "else", "time", "exec", "env", "!"}
FENCE = re.compile(r"^\s*```")
LOOP = re.compile(r"\bfor (\w+) in ([^;\n]+);")


def code_lines(text: str) -> list[str]:
    """The lines inside fenced code blocks labelled as shell (bash, sh, shell, console), with
    backslash continuations joined. Unlabelled blocks (program output, trees) are not read."""
    lines, inside, shell, pending = [], False, False, ""
    for line in text.splitlines():
        if FENCE.match(line):
            label = line.strip()[3:].strip().lower()
            inside, shell = (not inside), label in ("bash", "sh", "shell", "console")
            continue
        if not (inside and shell):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def qtts_commands(text: str) -> list[list[str]]:
    """Every ``qtts`` invocation (its arguments after ``qtts``) in the page's shell blocks; a loop
    variable (``for p in fast fastest; do ... --plan $p``) takes its first value."""
    commands = []
    loops = {name: values.split()[0] for name, values in LOOP.findall(text)}
    for line in code_lines(text):
        line = line.strip()
        if line.startswith("$ "):  # a console transcript's prompt
            line = line[2:]
        if "qtts" not in line:
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError as exc:  # an unclosed quote: a broken example
            raise AssertionError(f"cannot split {line!r}: {exc}") from None
        current: list[str] = []
        for word in words + [";"]:
            if word in SEPARATORS:
                if current and Path(current[0]).name == "qtts":
                    commands.append([_placeholder(w, loops, synopsis="[-" in line) for w in current[1:]])
                current = []
            elif current or not (word in PREFIXES or ("=" in word and not word.startswith("-"))):
                current.append(word)  # (VAR=value and shell keywords before a command are skipped)
    return commands


def _placeholder(word: str, loops: dict[str, str], synopsis: bool = False) -> str:
    """Shell variables (``$p``, ``$PLAN``) stand for a value: a loop's first, else a placeholder.
    A synopsis's optional part (``[--frames N]``) is checked as if given, its metavariables as 1."""
    if synopsis and (word.startswith("[-") or (word.endswith("]") and not word.startswith("["))):
        word = word.lstrip("[").rstrip("]")
    if synopsis and re.fullmatch(r"[A-Z][A-Z_]*", word):
        return "1"
    return re.sub(r"\$\{?(\w+)\}?", lambda m: loops.get(m.group(1), "x"), word)


def parse_error(argv: list[str], capsys) -> str | None:
    """None when ``qtts``'s parser accepts ``argv`` (``--help`` included), else its error."""
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return capsys.readouterr().err.strip() or f"exit {exc.code}"
    capsys.readouterr()
    return None


@pytest.mark.parametrize("page", PAGES)
def test_every_command_in_the_page_parses(page, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative output paths in the examples land nowhere that matters
    commands = qtts_commands((ROOT / page).read_text(encoding="utf-8"))
    assert commands or page not in MUST_SHOW, f"{page} shows no qtts command: the extractor is broken"
    bad = [f"qtts {shlex.join(argv)}\n    {err}" for argv in commands if (err := parse_error(argv, capsys))]
    assert not bad, f"{page}: commands the CLI refuses (fix the page or the CLI):\n" + "\n".join(bad)


def test_the_checker_refuses_a_flag_that_does_not_exist(capsys):
    page = '```bash\nqtts say "Hi." -m M -o a.wav --no-such-flag 3   # a comment\n```\n'
    [argv] = qtts_commands(page)
    assert argv == ["say", "Hi.", "-m", "M", "-o", "a.wav", "--no-such-flag", "3"]
    assert "--no-such-flag" in parse_error(argv, capsys)
    assert parse_error(["bench", "-m", "M", "--compare-official"], capsys) is None


def test_pipelines_continuations_and_prompts_are_split():
    page = ("```bash\nmy-llm | qtts say --live -f - -m M -o - | aplay -r 24000\n"
            "$ qtts export onnx -m DIR \\\n    -o b --weights int8\nQTTS_KERNELS=0 qtts kernels build\n```\n"
            "```python\nqtts.load('x')\n```\n"
            "```\ntools/  a tree, not a command (qtts bench)\n```\n"
            "```sh\nfor w in int8 int4; do qtts export onnx -m M -o b-$w --weights $w; done\n"
            "qtts decode CODES -m MODEL [--speed S] [--no-such]\n```\n")
    assert qtts_commands(page) == [["say", "--live", "-f", "-", "-m", "M", "-o", "-"],
                                   ["export", "onnx", "-m", "DIR", "-o", "b", "--weights", "int8"],
                                   ["kernels", "build"],
                                   ["export", "onnx", "-m", "M", "-o", "b-int8", "--weights", "int8"],
                                   ["decode", "1", "-m", "1", "--speed", "1", "--no-such"]]


@pytest.mark.parametrize("page", sorted(LIMITS))
def test_the_page_is_within_its_line_limit(page):
    lines = (ROOT / page).read_text(encoding="utf-8").count("\n")
    assert lines <= LIMITS[page], f"{page} has {lines} lines (limit {LIMITS[page]}): move detail to another page"
