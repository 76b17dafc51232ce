"""scripts/pyinstall.sh, the installer every test environment goes through: uv with pip's settings
handed over as flags, pip where uv cannot be had. Driven with stand-in ``python`` / ``uv`` programs
that record their arguments (the real installs are what scripts/test.sh does on every CI run)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "pyinstall.sh")


def _fake_env(tmp_path, uv_installs: bool) -> str:
    """A ``bin`` with a stand-in python: ``-`` runs the real interpreter (pip_config_flags), ``-m pip
    install ... uv==`` makes a recording ``uv`` (or fails), any other ``-m pip`` call is logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    uv = tmp_path / "uv.recorder"  # becomes bin/uv when pip "installs" uv
    uv.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {tmp_path}/uv.args\n')
    uv.chmod(0o755)
    get_uv = f"cp {uv} {bin_dir}/uv" if uv_installs else "exit 1"
    py = f"""#!/bin/sh
if [ "$1" = - ]; then exec {sys.executable} "$@"; fi
case "$*" in
  *"pip install -q uv=="*) {get_uv} ;;
  *) for a in "$@"; do printf "%s\\n" "$a"; done > {log} ;;
esac
"""
    (bin_dir / "python").write_text(py)
    (bin_dir / "python").chmod(0o755)
    return str(bin_dir / "python")


def _run(python: str, tmp_path, *args: str, **env) -> subprocess.CompletedProcess:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /wheels/a /wheels/b\nextra-index-url = file:///idx/simple\n"
                    "constraint = /c/constraints.txt\n")  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYINSTALL_"))}
    environ.update(PIP_CONFIG_FILE=str(conf), **env)
    quoted = " ".join(f"'{a}'" for a in args)
    return subprocess.run(["bash", "-c", f"source {SCRIPT}; pyinstall {python} {quoted}"], env=environ,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_uv_gets_pips_settings_and_the_arguments_intact(tmp_path):
    python = _fake_env(tmp_path, uv_installs=True)
    r = _run(python, tmp_path, "protobuf>=4.21.6,<=4.25.4", "--no-deps", "x y")
    assert r.returncode == 0, r.stderr
    args = (tmp_path / "uv.args").read_text().splitlines()
    assert args[:2] == ["pip", "install"] and args[args.index("--python") + 1] == python
    assert args[args.index("--index-strategy") + 1] == "unsafe-best-match" and "--compile-bytecode" in args
    pairs = set(zip(args, args[1:]))
    for pair in [("--find-links", "/wheels/a"), ("--find-links", "/wheels/b"),
                 ("--extra-index-url", "file:///idx/simple"), ("--constraint", "/c/constraints.txt")]:  # fmt: skip
        assert pair in pairs, (pair, args)
    assert args[-3:] == ["protobuf>=4.21.6,<=4.25.4", "--no-deps", "x y"]
    assert not (tmp_path / "log").exists()


def test_no_byte_compiling_when_asked(tmp_path):
    python = _fake_env(tmp_path, uv_installs=True)
    assert _run(python, tmp_path, "numpy", PYINSTALL_COMPILE="0").returncode == 0
    assert "--compile-bytecode" not in (tmp_path / "uv.args").read_text().splitlines()


def test_pip_installs_when_uv_cannot_be_had(tmp_path):
    python = _fake_env(tmp_path, uv_installs=False)
    r = _run(python, tmp_path, "numpy==1.26.4", "--no-deps")
    assert r.returncode == 0 and "uv not available; installing with pip" in r.stderr, r.stderr
    pip_args = ["-m", "pip", "install", "-q", "numpy==1.26.4", "--no-deps"]
    assert (tmp_path / "log").read_text().splitlines() == pip_args
