"""Scripts and examples use the package's public names only (a private name can change without notice)."""

from __future__ import annotations

import ast
import glob
import os

from conftest import REPO_ROOT


def _private_imports(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "qtts":
            parts = node.module.split(".") + [a.name for a in node.names]
            bad += [f"{os.path.relpath(path, REPO_ROOT)}:{node.lineno} {node.module}.{p}" for p in parts
                    if p.startswith("_") and not (p.startswith("__") and p.endswith("__"))]  # fmt: skip
    return bad


def test_scripts_import_no_private_name_of_the_package():
    files = [p for d in ("scripts", "benchmarks", "examples")
             for p in glob.glob(os.path.join(REPO_ROOT, d, "**", "*.py"), recursive=True)]  # fmt: skip
    assert len(files) > 20
    assert [b for f in files for b in _private_imports(f)] == []


def test_the_check_sees_a_private_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from qtts.tools.bench import one_run, _median\nfrom qtts.engine import _x\n")
    assert len(_private_imports(str(bad))) == 2
