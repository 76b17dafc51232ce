"""The container files cannot rot silently: Dockerfile, .dockerignore, compose.yaml, container/plan.sh.

Cheap and CI-safe (no podman, no image build): every path the Dockerfile copies exists and is in the
build context, every extra it installs exists, every stage it names is defined, and every ``qtts``
command in compose.yaml, container/plan.sh and scripts/container.sh parses with the real argparse
parser. container/plan.sh runs here against a stand-in ``qtts`` (build once, atomically). The real
image build and run is scripts/container.sh (minutes: docs/container.md).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess

import pytest
import yaml

from conftest import REPO_ROOT
from qtts.cli import build_parser

PLAN_SH = os.path.join(REPO_ROOT, "container", "plan.sh")
SCRIPT = os.path.join(REPO_ROOT, "scripts", "container.sh")


def read(*parts: str) -> str:
    with open(os.path.join(REPO_ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) for each Dockerfile line, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", read("Dockerfile"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[str]:
    return [m.group(1) for word, rest in instructions() if word == "FROM"
            for m in [re.search(r"\bAS\s+(\S+)$", rest, re.I)] if m]


def in_context(path: str) -> bool:
    """Whether the .dockerignore (an allow-list: '*' then '!name' lines) lets ``path`` into the context."""
    allowed = True
    for line in read(".dockerignore").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!")
        top = path.split("/")[0]
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(top, pattern):
            allowed = negate
    return allowed


def test_dockerfile_copies_exist_and_are_in_the_context():
    copies = [rest for word, rest in instructions() if word == "COPY" and "--from=" not in rest]
    assert copies, "no COPY found: the parser above no longer reads the Dockerfile"
    for rest in copies:
        *sources, _dest = shlex.split(rest)
        for src in sources:
            assert os.path.exists(os.path.join(REPO_ROOT, src)), f"Dockerfile copies {src}, which is not in the repo"
            assert in_context(src), f"Dockerfile copies {src}, but .dockerignore keeps it out of the build context"
    assert not in_context(".git") and not in_context(".venv") and not in_context("tests")
    assert in_context(".wheels"), "scripts/container.sh builds with WHEELS=.wheels: .dockerignore must allow it"


def test_dockerfile_extras_and_stages_exist():
    section = read("pyproject.toml").split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = re.findall(r"^([a-z0-9_-]+) = \[", section, re.M)
    assert "serve" in extras and "export" in extras, extras
    named = re.findall(r'"\.\[([a-z0-9_,-]+)\]"', read("Dockerfile"))
    assert named, "no pip install of the project found in the Dockerfile"
    for group in named:
        for extra in group.split(","):
            assert extra in extras, f"Dockerfile installs extra {extra!r}, which pyproject.toml does not define"
    defined = stages()
    for word, rest in instructions():
        for ref in re.findall(r"--from=(\S+)", rest) + ([rest.split()[0]] if word == "FROM" else []):
            assert ref in defined or ref == "${BASE}", f"Dockerfile uses stage {ref!r}, defined: {defined}"
    assert defined[-1] == "runtime", "the default target (last stage) must be the runtime image"
    assert "plan" in defined
    text = read("Dockerfile")
    assert "ARG BASE=python:3.12-slim" in text
    assert re.search(r"^USER qtts$", text, re.M), "the images must not run as root"
    assert "QTTS_CACHE=/cache" in text


def expand(value: str) -> str:
    """Compose's ${VAR:-default} / ${VAR} with an empty environment."""
    return re.sub(r"\$\{[A-Z_]+(?::-([^}]*))?\}", lambda m: m.group(1) or "", value)


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(read("compose.yaml"))


def parse(argv: list[str]):
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse refused a flag
        pytest.fail(f"`qtts {' '.join(argv)}` does not parse (exit {exc.code})")


def test_compose_services_and_volumes(compose):
    services = compose["services"]
    assert set(services) >= {"plan", "qtts", "wyoming"}
    assert set(compose["volumes"]) >= {"cache", "voices"}
    targets = set(stages())
    for name, svc in services.items():
        assert svc["build"]["target"] in targets, f"service {name}: target {svc['build']['target']!r} is not a stage"
        assert "./models:/models:ro" in svc["volumes"], f"service {name}: models must be mounted read-only"
        assert "cache:/cache" in svc["volumes"]
    assert services["plan"]["build"]["target"] == "plan" and services["plan"]["restart"] == "no"
    for name in ("qtts", "wyoming"):
        assert services[name]["depends_on"]["plan"]["condition"] == "service_completed_successfully"
        assert "voices:/voices" in services[name]["volumes"]


def bundle_of(model: str, weights: str = "int8") -> str:
    """The bundle path container/plan.sh builds for ``model`` (its QTTS_BUNDLE default)."""
    return f"/cache/{os.path.basename(model)}-{weights}/plan.json"


def test_compose_commands_parse_and_match_the_plan(compose):
    services = compose["services"]
    env = {k: expand(v) for k, v in services["plan"]["environment"].items()}
    serve = parse([expand(a) for a in services["qtts"]["command"]])
    assert serve.host == "0.0.0.0" and serve.voices == "/voices"
    assert serve.model == env["QTTS_MODEL"], "qtts must serve the checkpoint the plan service exported"
    assert serve.plan == bundle_of(env["QTTS_MODEL"], env["QTTS_WEIGHTS"])
    assert any(expand(p).endswith(f":{serve.port}") for p in services["qtts"]["ports"])
    check = " ".join(services["qtts"]["healthcheck"]["test"])
    assert f"127.0.0.1:{serve.port}/health" in check
    wyoming = parse([expand(a) for a in services["wyoming"]["command"]])
    assert wyoming._run.__module__ == "qtts.cli.wyoming"
    assert (wyoming.model, wyoming.plan) == (serve.model, serve.plan)
    port = wyoming.uri.rsplit(":", 1)[1]
    assert any(expand(p).endswith(f":{port}") for p in services["wyoming"]["ports"])
    for svc in ("qtts", "wyoming"):
        assert all(expand(p).startswith("127.0.0.1:") for p in services[svc]["ports"]), "default: loopback only"


def qtts_lines(path: str, pattern: str, values: dict | None = None) -> list[list[str]]:
    """argv lists of the shell lines (continuations joined) matching ``pattern``; each shell variable
    becomes ``values[name]`` (default "X"), a redirection ends the command."""
    with open(path, encoding="utf-8") as fh:
        text = re.sub(r"\\\n\s*", " ", fh.read())
    out = []
    for m in re.finditer(pattern, text, re.M):
        line = re.sub(r'"?\$\{?([A-Za-z_]+)\}?"?', lambda v: (values or {}).get(v.group(1), "X"), m.group(1))
        out.append(shlex.split(line.split(">")[0]))
    return out


def test_plan_script_and_project_script_commands_parse():
    (export,) = qtts_lines(PLAN_SH, r"^qtts (export onnx .*)$", {"weights": "int8"})
    assert parse(export).weights == "int8"
    runs = qtts_lines(SCRIPT, r'"\$IMAGE" ((?:serve|wyoming) .*)$')
    assert {a[0] for a in runs} == {"serve", "wyoming"}, runs
    for argv in runs:
        parse(argv)
    (ckpt,) = qtts_lines(SCRIPT, r"-m qtts (random-checkpoint .*)$")
    assert parse(ckpt).kind == "custom_voice"  # the speech request asks for the built-in voice vivian
    for script in (SCRIPT, PLAN_SH):
        shell = "bash" if script == SCRIPT else "sh"
        proc = subprocess.run([shell, "-n", script], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert os.access(script, os.X_OK), f"{script} is not executable"


FAKE_QTTS = """#!/bin/sh
# stand-in for `qtts export onnx --model M -o OUT --weights W`: record the call, write OUT/plan.json
echo "$@" >> "$CALLS"
[ -n "${FAIL:-}" ] && { mkdir -p "$6"; echo half > "$6/talker.onnx"; exit 1; }
mkdir -p "$6" && echo '{}' > "$6/plan.json"
"""


def run_plan(tmp_path, model: str, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "qtts"
    fake.write_text(FAKE_QTTS)
    fake.chmod(0o755)
    full = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "QTTS_CACHE": str(tmp_path / "cache"),
            "QTTS_MODEL": model, "CALLS": str(tmp_path / "calls"), **env}
    return subprocess.run(["sh", PLAN_SH], capture_output=True, text=True, env=full, timeout=60)


def test_plan_script_builds_once_and_atomically(tmp_path):
    model = tmp_path / "models" / "tiny"
    missing = run_plan(tmp_path, str(model))
    assert missing.returncode == 2 and "config.json is missing" in missing.stderr
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    failed = run_plan(tmp_path, str(model), FAIL="1")
    assert failed.returncode == 1
    assert not (tmp_path / "cache" / "tiny-int8").exists(), "a failed build must not leave a bundle"
    first = run_plan(tmp_path, str(model))
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "cache" / "tiny-int8" / "plan.json").is_file()
    assert not (tmp_path / "cache" / "tiny-int8.partial").exists()
    again = run_plan(tmp_path, str(model))
    assert again.returncode == 0 and "nothing to build" in again.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2, calls  # the failed try and the build; the third start exported nothing
    assert calls[-1].split() == ["export", "onnx", "--model", str(model), "-o",
                                 str(tmp_path / "cache" / "tiny-int8.partial"), "--weights", "int8"]


def test_plan_script_honours_weights_and_bundle(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = run_plan(tmp_path, str(model), QTTS_WEIGHTS="int4", QTTS_BUNDLE=str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b" / "plan.json").is_file()
    assert (tmp_path / "calls").read_text().split()[-1] == "int4"


def test_wheels_and_images_stay_out_of_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".wheels/x.whl"], cwd=REPO_ROOT)
    assert ignored.returncode == 0, ".wheels/ (scripts/container.sh downloads) must be in .gitignore"
