"""The layout rules of docs/design.md, checked on the source with ast (no imports, no timing).

* no import circles in ``src/qtts`` (lazy, function-level imports count too);
* ``qtts.model`` imports only ``qtts.model``, ``qtts.config`` and ``qtts.errors``;
* neither ``qtts.api`` nor any runtime (``qtts.backends``) reaches ``qtts.export``, with no exception: the
  plan cache builds a missing preset in a child process (``python -m qtts.export.cache_build``, started by
  name from plans/build.py), so the loading process never imports the exporter;
* every file is under 400 lines and every function under 50 (STYLE.md's size budget);
* the package tree in docs/design.md lists exactly the modules that exist;
* engine/ and text/ import no torch and no runtime; tools/ is never reached from the runtime;
* one frames -> chunks loop (engine/stream.py) and an explicit batch seam (BatchBackend).
"""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

from conftest import REPO_ROOT, copy_cache

SRC = os.path.join(REPO_ROOT, "src")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 50
GROUND = {"qtts.config", "qtts.errors"}


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


def test_the_build_child_is_started_by_name_not_imported():
    """plans/build.py names the child's module as a string (a real module with a __main__ entry);
    no runtime module imports it (test_runtime_never_reaches_export)."""
    with open(MODULES["qtts.plans.build"], encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    names = {node.targets[0].id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)}  # fmt: skip
    child = names["CHILD"]
    assert child == "qtts.export.cache_build" and child in MODULES
    with open(MODULES[child], encoding="utf-8") as fh:
        assert 'if __name__ == "__main__":' in fh.read()
    assert not any(child in deps for mod, deps in GRAPH.items() if not mod.startswith("qtts.export"))


def test_no_import_circles():
    circles = sorted(m for m in MODULES if m in _reach(m))
    assert circles == [], f"modules on an import circle: {circles}"


def test_model_imports_nothing_above_it():
    bad = {m: sorted(d for d in deps if not d.startswith("qtts.model") and d not in GROUND)
           for m, deps in GRAPH.items() if m.startswith("qtts.model")}  # fmt: skip
    assert {m: d for m, d in bad.items() if d} == {}


@pytest.mark.parametrize("start", ["qtts", "qtts.api"] + sorted(m for m in MODULES if m.startswith(("qtts.backends", "qtts.plans"))))
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


def _external_imports(mod: str) -> set[str]:
    """Top-level names of the non-qtts packages a module imports (lazy imports too)."""
    with open(MODULES[mod], encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"qtts"}


RUNTIMES = {"torch", "onnxruntime", "onnx", "rknn", "rknnlite", "executorch", "transformers", "fastapi", "wyoming"}


@pytest.mark.parametrize("folder", ["qtts.engine", "qtts.text"])
def test_engine_and_text_need_no_torch_and_no_runtime(folder):
    mods = [m for m in MODULES if m == folder or m.startswith(folder + ".")]
    assert mods
    bad = {m: sorted(_external_imports(m) & RUNTIMES) for m in mods}
    assert {m: d for m, d in bad.items() if d} == {}
    # the only runtime-side module they reach is the seam's protocol file (pure numpy)
    reach = set().union(*(_reach(m) for m in mods))
    allowed = {"qtts.backends", "qtts.backends.base", "qtts.plans", "qtts.plans.plan"}
    assert sorted(d for d in reach if d.startswith(("qtts.backends", "qtts.plans")) and d not in allowed) == []


@pytest.mark.parametrize("start", ["qtts", "qtts.api", "qtts.engine.stream", "qtts.engine.batching", "qtts.backends",
                                   "qtts.backends.torch", "qtts.backends.onnx", "qtts.server.app"])  # fmt: skip
def test_tools_are_never_imported_by_the_runtime(start):
    assert sorted(d for d in _reach(start) | {start} if d.startswith("qtts.tools")) == []


def test_one_frames_to_chunks_loop():
    """The frames -> chunks loop lives in engine/stream.py alone (stream, stream_text and decode share it);
    the synthesis body in engine/synth.py alone: ``qtts bench``, the perf scripts and the capacity probe
    call it through ``TTS.stream`` (none drives a Chunker or a generation loop of its own)."""
    assert not {"qtts.chunking", "qtts.pipeline", "qtts.textsource"} & set(MODULES)
    pushers, private = [], []
    for mod, path in MODULES.items():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if re.search(r"chunker\.(push|drain|flush)\(", text) and mod != "qtts.engine.stream":
            pushers.append(mod)
        if mod != "qtts.api" and re.search(r"\b(tts|self\.tts|engine)\._stream", text):
            private.append(mod)
    assert pushers == [] and private == []
    scripts = [p for d in ("scripts", "benchmarks") for p in glob.glob(os.path.join(REPO_ROOT, d, "**", "*.py"), recursive=True)
               if re.search(r"Chunker\(|\b_one_run\b|\b_loop_params\b", open(p, encoding="utf-8").read())]  # fmt: skip
    assert scripts == [], f"scripts with a synthesis body of their own: {scripts}"


#: the optional members of the backend seam: declared with defaults in qtts.backends.base, never probed
SEAM_MEMBERS = ("thread_safe", "batches", "prime", "close", "run_batch", "talker_rows", "predict_frames", "release")


def test_the_seam_is_declared_and_never_probed():
    """Every optional member of a backend, vocoder or vocoder stream is declared (with its default) in the
    protocols of backends/base.py, every runtime subclasses them, and no module looks a member up with
    getattr/hasattr."""
    from qtts.backends import base, executorch, onnx, onnx_batch, torch, vocoder_batch, vocoder_step

    assert base.Backend.thread_safe is False and base.Vocoder.batches is False
    assert callable(base.VocoderStream.prime) and callable(base.VocoderStream.close)
    for cls in (torch.TorchBackend, onnx.OnnxBackend, onnx_batch.OnnxBatchBackend, executorch.EtBackend):
        assert base.Backend in cls.__mro__, cls
    for cls in (vocoder_step.StepVocoder, torch.TorchFullVocoder):
        assert base.Vocoder in cls.__mro__, cls
    for cls in (vocoder_step.StepStream, vocoder_batch.BatchedVocoderStream, torch._FullStream):
        assert base.VocoderStream in cls.__mro__, cls
    owner = r"(?:self\.)?(?:backend|vocoder|decoder|steps|components|parts|engine|tts)\w*"
    probe = re.compile(r"\b(?:getattr|hasattr)\(\s*" + owner + r"\s*,\s*[\"'](" + "|".join(SEAM_MEMBERS) + r")[\"']")
    found = []
    for mod, path in MODULES.items():
        with open(path, encoding="utf-8") as fh:
            found += [f"{mod}: {m.group(0)}" for m in probe.finditer(fh.read())]
    assert found == [], found


def test_the_batch_seam_is_a_protocol():
    """engine/ asks ``isinstance(backend, BatchBackend)``, never ``hasattr`` (the seam is explicit)."""
    for mod in (m for m in MODULES if m.startswith("qtts.engine")):
        with open(MODULES[mod], encoding="utf-8") as fh:
            assert "hasattr(backend" not in fh.read(), mod
    from qtts.backends.base import BatchBackend
    from qtts.backends.onnx_batch import OnnxBatchBackend
    from qtts.backends.torch import TorchBackend

    methods = {"talker_rows", "predict_frames", "release"}
    assert methods <= set(dir(BatchBackend))
    for cls in (TorchBackend, OnnxBatchBackend):  # the batched runtimes implement every method of it
        assert methods <= set(dir(cls)), cls


_TRACE = r"""
import inspect, json, os, sys, threading
import qtts
root = os.path.dirname(qtts.__file__)
seen = set()
def prof(frame, event, arg):
    code = frame.f_code
    if event != "call" or not code.co_flags & inspect.CO_OPTIMIZED or not code.co_filename.startswith(root):
        return  # not a function (module and class bodies run at import are not counted)
    seen.add(os.path.relpath(code.co_filename, root).replace(os.sep, "/"))
threading.setprofile(prof)
sys.setprofile(prof)
tts = qtts.load(sys.argv[1])
for chunk in tts.stream("Hello there.", speaker=tts.speakers[0], options=qtts.SynthesisOptions(max_frames=4)):
    pass
sys.setprofile(None)
threading.setprofile(None)
print(json.dumps(sorted(f for f in seen if not f.startswith("model/"))))
"""


#: the files outside model/ one ``load`` + ``stream`` may execute on the default path: no plan named, the
#: checkpoint's ``fast`` ONNX plan and the kernel library already in the cache (what every load after the
#: first runs). 15 before the loop's sampling joined the loop (engine/sampling.py into engine/generate.py;
#: the batched phases to engine/batching.py, the loop's parameters to options.py); 16 before the bundle's
#: embedding tables joined the plan file (reading) and the bundle writer (writing): backends/tables.py into
#: plans/plan.py and export/write.py; 18 before the bundle's
#: manifest and fingerprint joined the plan file (plans/bundle.py into plans/plan.py) and the 2 MB page
#: advice joined the place that builds the parts (backends/pages.py into backends/__init__.py); 20 before
#: the onnx runtime imported onnxruntime at its top (errors.py's ``require`` per session) and a cached
#: kernel library was only looked up (kernels/build.py joined kernels/__init__.py)
MAX_REQUEST_FILES = 14
#: the same request on the torch fp32 reference (``QTTS_PLAN=torch``, as in every other test): 19 before the
#: torch plan skipped the plan cache, the vocoder stopped re-checking the engine's frames, the loader moved
#: to model/, the predictor's step loop to the loop's sampler, the package imported its public names, the
#: torch runtime imported torch at its top and a one-piece text skipped the sentence splitter; 12, then 13
#: when the synthesis body moved out of api.py into engine/synth.py (issue 37), 12 again when the loop's
#: sampling joined the loop (engine/sampling.py into engine/generate.py)
MAX_TORCH_REQUEST_FILES = 12


def _trace(snapshot: str, **env: str) -> list[str]:
    """The files outside model/ that ``_TRACE`` ran (a fresh process, ``env`` added; None values unset)."""
    import json
    import subprocess
    import sys

    environ = dict(os.environ, PYTHONPATH=SRC, **{k: v for k, v in env.items() if v is not None})
    for key in (k for k, v in env.items() if v is None):
        environ.pop(key, None)
    out = subprocess.run([sys.executable, "-c", _TRACE, snapshot], capture_output=True, text=True, check=True,
                         env=environ, timeout=300)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_plan_cache(tiny_snapshot, tiny_default_cache, tmp_path_factory):
    """(snapshot, cache root): the tiny CustomVoice checkpoint's default (``fast``) plan (built by a first
    load: conftest's ``tiny_default_cache``) and the kernel library ``qtts kernels build`` puts in a
    fresh ``QTTS_CACHE``."""
    import subprocess
    import sys

    snapshot = tiny_snapshot(kind="custom_voice")
    root = copy_cache(tiny_default_cache, str(tmp_path_factory.mktemp("default-plan-cache")))
    env = {k: v for k, v in os.environ.items() if k not in ("QTTS_PLAN", "QTTS_KERNELS")}
    subprocess.run([sys.executable, "-m", "qtts", "kernels", "build"], capture_output=True, text=True, check=True,
                   env=dict(env, PYTHONPATH=SRC, QTTS_CACHE=root), timeout=600)  # fmt: skip
    return snapshot, root


def test_files_one_request_runs(default_plan_cache):
    """docs/design.md lists the files outside model/ that ``load`` + ``stream`` execute on the default
    path (no plan named, its bundle cached; measured here) with the bundle's ONNX vocoder: what runs on a
    CPU without bf16 instructions (the bf16 vocoder's own count: the next test)."""
    snapshot, root = default_plan_cache
    ran = _trace(snapshot, QTTS_CACHE=root, QTTS_PLAN=None, QTTS_KERNELS=None, QTTS_NO_BUILD="1",
                 QTTS_BF16_VOCODER="0")  # fmt: skip
    assert "backends/onnx.py" in ran and "backends/torch.py" not in ran, ran  # the cached fast plan ran
    assert "api.py" in ran and "engine/stream.py" in ran and "engine/generate.py" in ran
    with open(os.path.join(REPO_ROOT, "docs", "design.md"), encoding="utf-8") as fh:
        block = fh.read().split("<!-- request-files -->", 1)[1].split("<!-- /request-files -->", 1)[0]
    listed = re.findall(r"`([\w/]+\.py)`", block)
    assert sorted(listed) == ran, f"docs/design.md lists {sorted(listed)}, a request runs {ran}"
    assert f"{len(ran)} files" in block
    assert len(ran) <= MAX_REQUEST_FILES, ran


#: the default path where the CPU has bf16 instructions: the ONNX generation with the torch bf16 vocoder
#: step (backends/torch.py joins; its batch-invariant linear layers are imported only by a batched engine)
MAX_BF16_REQUEST_FILES = MAX_REQUEST_FILES + 1


def test_files_one_bf16_vocoder_request_runs(default_plan_cache):
    """Where the CPU has bf16 instructions the default path runs the bf16 vocoder step, in a bounded
    number of files; elsewhere it must run the ONNX one (what the previous test counts)."""
    from qtts.plans.plan import bf16_vocoder_runs_here

    snapshot, root = default_plan_cache
    ran = _trace(snapshot, QTTS_CACHE=root, QTTS_PLAN=None, QTTS_KERNELS=None, QTTS_NO_BUILD="1",
                 QTTS_BF16_VOCODER=None)  # fmt: skip
    if not bf16_vocoder_runs_here():
        assert "backends/torch.py" not in ran, ran
        return
    assert "backends/torch.py" in ran and "backends/torch_rows.py" not in ran, ran
    assert len(ran) <= MAX_BF16_REQUEST_FILES, ran


def test_files_one_torch_request_runs(tiny_snapshot):
    """The torch fp32 reference runs no plan cache and no ONNX runtime: fewer files than the default path."""
    ran = _trace(tiny_snapshot(kind="custom_voice"), QTTS_PLAN="torch")
    assert "backends/torch.py" in ran and not [f for f in ran if f.startswith(("plans/cache", "backends/onnx"))]
    assert len(ran) <= MAX_TORCH_REQUEST_FILES, ran
