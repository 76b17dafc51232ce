"""The layout rules of docs/design.md, checked on the source with ast (no imports, no timing).

* no import circles in ``src/qtts`` (lazy, function-level imports count too);
* ``qtts.model`` imports only ``qtts.model``, ``qtts.config`` and ``qtts.errors``;
* neither ``qtts.api`` nor any runtime (``qtts.backends``) reaches ``qtts.export``, except through the
  one declared edge :data:`BUILD_EDGE`: the plan cache calls the exporter to build a missing preset
  (lazily; a cached or exported bundle never imports ``qtts.export``, tests/test_no_torch_runtime.py);
* every file is under 400 lines and every function under 50 (STYLE.md's size budget);
* the package tree in docs/design.md lists exactly the modules that exist.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from conftest import REPO_ROOT

SRC = os.path.join(REPO_ROOT, "src")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 50
GROUND = {"qtts.config", "qtts.errors"}
#: the one runtime -> export import: qtts.backends.cache builds a missing preset's bundle (docs/design.md)
BUILD_EDGE = ("qtts.backends.cache", "qtts.export.cache_build")


def _modules() -> dict[str, str]:
    mods = {}
    for root, _dirs, files in os.walk(os.path.join(SRC, "qtts")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                mod = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
                mods[mod.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _targets(mod: str, node: ast.AST) -> set[str]:
    """The qtts modules an import statement of ``mod`` loads."""
    package = mod if MODULES[mod].endswith("__init__.py") else mod.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        if name and name != mod:
            out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for mod, path in MODULES.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        graph[mod] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[mod] |= _targets(mod, node)
    return graph


GRAPH = _graph()
GRAPH[BUILD_EDGE[0]].discard(BUILD_EDGE[1])  # checked below to be the only one of its kind


def _reach(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in GRAPH[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_checker_sees_the_package():
    assert {"qtts.api", "qtts.backends.torch", "qtts.model.layers", "qtts.export.onnx"} <= set(MODULES)
    assert "qtts.backends.onnx" in GRAPH["qtts.backends"]  # lazy imports inside functions count
    assert "qtts.model.layers" in GRAPH["qtts.model.talker"]


def test_the_build_edge_is_real_and_lazy():
    """The declared edge exists and sits inside a function (importing the cache imports no exporter)."""
    with open(MODULES[BUILD_EDGE[0]], encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    top = {t for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
           for t in _targets(BUILD_EDGE[0], node)}  # fmt: skip
    every = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for t in _targets(BUILD_EDGE[0], node)}  # fmt: skip
    assert BUILD_EDGE[1] in every and not any(t.startswith("qtts.export") for t in top)


def test_no_import_circles():
    circles = sorted(m for m in MODULES if m in _reach(m))
    assert circles == [], f"modules on an import circle: {circles}"


def test_model_imports_nothing_above_it():
    bad = {m: sorted(d for d in deps if not d.startswith("qtts.model") and d not in GROUND)
           for m, deps in GRAPH.items() if m.startswith("qtts.model")}  # fmt: skip
    assert {m: d for m, d in bad.items() if d} == {}


@pytest.mark.parametrize("start", ["qtts", "qtts.api"] + sorted(m for m in MODULES if m.startswith("qtts.backends")))
def test_runtime_never_reaches_export(start):
    assert sorted(d for d in _reach(start) if d.startswith("qtts.export")) == []


def test_file_and_function_sizes():
    long_files, long_functions = [], []
    for mod, path in sorted(MODULES.items()):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{mod} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{mod}:{node.lineno} {node.name} ({n} lines)")
    assert long_files == [] and long_functions == []


def _doc_tree() -> set[str]:
    """Paths of the package tree in docs/design.md (the first code block under '## Package layout')."""
    with open(os.path.join(REPO_ROOT, "docs", "design.md"), encoding="utf-8") as fh:
        text = fh.read()
    block = text.split("## Package layout", 1)[1].split("```", 2)[1]
    paths, stack = set(), []
    for line in block.splitlines():
        token = line.strip().split(" ", 1)[0]
        if not re.fullmatch(r"[A-Za-z_][\w/]*(\.py|/)", token):
            continue  # a description line
        depth = (len(line) - len(line.lstrip())) // 2
        stack[depth:] = [token]
        if token.endswith(".py"):
            paths.add("".join(stack))
    return {p.removeprefix("src/qtts/") for p in paths}


def test_design_doc_lists_every_module():
    actual = {os.path.relpath(p, os.path.join(SRC, "qtts")).replace(os.sep, "/") for p in MODULES.values()}
    listed = _doc_tree()
    assert sorted(actual - listed) == [], "modules missing from the docs/design.md tree"
    assert sorted(listed - actual) == [], "docs/design.md lists modules that do not exist"
