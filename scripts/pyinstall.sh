# Sourced by scripts/test.sh and the setup_*_env.sh scripts: `pyinstall PYTHON ARGS...` installs pip
# requirement ARGS into PYTHON's virtual environment with uv (installed into that environment first,
# from PyPI through pip), which resolves and unpacks in parallel and links from its cache: a clean
# .venv took ~95 s with pip, 24 s this way byte-compiled, 12 s not, on the 2-core VM (docs/testing.md). Where uv cannot be
# had, pip does the same install. uv reads no pip configuration, so pip's own (find-links, index
# URLs, constraints: `pip config list` and PIP_* variables) is handed to it as flags, and
# --index-strategy unsafe-best-match picks the newest release over every index as pip does.
# uv byte-compiles the installed modules (as pip does) unless PYINSTALL_COMPILE=0: the side
# environments set that and compile only what their runs import, by importing it once (the setup
# scripts' ready checks). Where PYTHONDONTWRITEBYTECODE is set (it is in this project's sessions),
# every process would otherwise compile what it imports again (+3 s an import of torch and qtts).
UV_VERSION=0.13.9

pip_config_flags() {  # pip_config_flags PYTHON: pip's find-links / index / constraint settings as uv flags
  "$1" - <<'PY'
import ast, shlex, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flag = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
        "constraint": "--constraint"}
args = []
for line in out.splitlines():
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if name in flag and value:
        for item in ast.literal_eval(value).split():
            if item not in args:
                args += [flag[name], item]
print(shlex.join(args))
PY
}

pyinstall() {  # pyinstall PYTHON ARGS...: pip-style install ARGS into PYTHON's environment
  local py=$1 bin
  shift
  bin=$(dirname "$py")
  if [ ! -x "$bin/uv" ]; then
    "$py" -m pip install -q "uv==$UV_VERSION" >/dev/null 2>&1 || echo "pyinstall: uv not available; installing with pip" >&2
  fi
  if [ -x "$bin/uv" ]; then
    local flags
    flags=$(pip_config_flags "$py")
    [ "${PYINSTALL_COMPILE:-1}" = 0 ] || flags="--compile-bytecode $flags"
    eval "\"\$bin/uv\" pip install -q --python \"\$py\" --index-strategy unsafe-best-match $flags \"\$@\""
  else
    "$py" -m pip install -q "$@"
  fi
}
