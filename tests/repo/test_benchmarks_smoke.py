"""Every file in scripts/ and benchmarks/ is smoke-tested here or by a named test (issue 37).

A script the docs cite must still start on the current API: each Python script runs ``--help``
(argparse usage, exit 0) in ONE subprocess (runpy, so the imports are paid once); a helper module
imports; a shell script passes ``bash -n``; a C prototype passes ``gcc -fsyntax-only`` with the
flags its users compile it with. The quick benchmarks run for real here on a tiny checkpoint
(``REAL_RUNS``, one process too); scripts that another test runs for real are named in ``RUN_BY``
(their ``--help`` runs here too). A new file with none of these checks fails the listing test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO_ROOT

DIRS = ("scripts", "benchmarks")
#: modules imported by the scripts beside them (no command line of their own)
IMPORT_ONLY = {"benchmarks/arm_compare.py", "benchmarks/peer_gguf_layout.py", "benchmarks/perf/_common.py",
               "benchmarks/soak_attackers.py", "benchmarks/soak_attackers_r2.py", "benchmarks/soak_local.py"}  # fmt: skip
#: scripts a test runs for real (a tiny checkpoint, a made-up run folder): the test that does
RUN_BY = {
    "benchmarks/capacity.py": "tests/repo/test_capacity_script.py",
    "benchmarks/soak.py": "tests/server/test_soak.py",
    "benchmarks/soak_attackers.py": "tests/server/test_soak.py",
    "benchmarks/soak_local.py": "tests/server/test_soak.py",
    "benchmarks/batch_rows.py": "tests/engine/test_batching.py",
    "benchmarks/arm_compare.py": "tests/kernels/test_arm_compare.py",
    "benchmarks/ladder.py": "tests/export/test_mixed_bundle.py",
    "benchmarks/sensitivity.py": "tests/export/test_sensitivity_script.py",
    "benchmarks/peer_gguf.py": "tests/parity/test_peer_gguf.py",
    "benchmarks/peer_gguf_layout.py": "tests/parity/test_peer_gguf.py",
    "scripts/container.sh": "tests/repo/test_container_files.py",
}
#: C prototypes of benchmarks/perf/gemv_vnni.py and docs/history/performance.md, checked with these flags
C_FLAGS = ["-O2", "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-fopenmp"]
DOCS = {"benchmarks/README.md"}

_SWEEP = r"""
import contextlib, io, json, os, runpy, sys
res = {}
for rel, mode in json.loads(sys.argv[1]):  # mode: "help", "import" or the argument list of a real run
    out, argv0, path0 = io.StringIO(), list(sys.argv), list(sys.path)
    sys.argv = [rel] + (["--help"] if mode == "help" else [] if mode == "import" else mode)
    sys.path.insert(0, os.path.dirname(os.path.abspath(rel)))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(rel, run_name="smoke" if mode == "import" else "__main__")
        res[rel] = [None, out.getvalue()]
    except SystemExit as e:
        res[rel] = [e.code, out.getvalue()]
    except Exception as e:
        res[rel] = ["%s: %s" % (type(e).__name__, e), out.getvalue()]
    sys.argv, sys.path[:] = argv0, path0
print(json.dumps(res))
"""


def _files() -> list[str]:
    found = []
    for d in DIRS:
        for base, dirs, names in os.walk(os.path.join(REPO_ROOT, d)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            found += [os.path.relpath(os.path.join(base, n), REPO_ROOT).replace(os.sep, "/") for n in names]
    return sorted(found)


def _kind(rel: str) -> str | None:
    if rel in DOCS:
        return "doc"
    if rel.endswith(".py"):
        return "import" if rel in IMPORT_ONLY else "help"
    return {".sh": "bash", ".c": "c"}.get(os.path.splitext(rel)[1])


def test_every_file_has_a_smoke_entry():
    files = _files()
    assert "scripts/test.sh" in files and "benchmarks/perf/profile_plan.py" in files, files
    assert [f for f in files if _kind(f) is None] == [], (
        "a file in scripts/ or benchmarks/ without a smoke check"
    )
    assert [f for f in files if f.startswith("scripts/") and f.endswith(".py")] == [], (
        "Python tools go to benchmarks/"
    )
    assert sorted(f for f in set(RUN_BY) | IMPORT_ONLY | DOCS if f not in files) == [], (
        "an entry names no file"
    )
    assert all(os.path.exists(os.path.join(REPO_ROOT, t)) for t in RUN_BY.values())


def _sweep(jobs: list) -> dict:
    """{file: [exit code (None: returned), stdout]} of each job, all in one Python process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.join(REPO_ROOT, "src"),
                                                                   os.environ.get("PYTHONPATH")) if p))  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _SWEEP, json.dumps(jobs)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(res) == sorted(f for f, _ in jobs)
    return res


def test_every_python_script_starts_and_every_module_imports():
    jobs = [[f, _kind(f)] for f in _files() if _kind(f) in ("help", "import")]
    res = _sweep(jobs)
    bad = {f: r for f, k in jobs for r in [res[f]]
           if (k == "help" and (r[0] != 0 or not r[1].startswith("usage:"))) or (k == "import" and r[0] is not None)}  # fmt: skip
    assert bad == {}, f"--help failed or printed no argparse usage / a module did not import: {bad}"


def test_shell_scripts_parse():
    for rel in [f for f in _files() if _kind(f) == "bash"]:
        proc = subprocess.run(["bash", "-n", os.path.join(REPO_ROOT, rel)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{rel}: {proc.stderr}"


def test_c_prototypes_compile():
    cc = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    assert cc, "no C compiler: scripts/test.sh installs gcc (the kernels tests need one too)"
    for rel in [f for f in _files() if _kind(f) == "c"]:
        proc = subprocess.run([cc, "-fsyntax-only", *C_FLAGS, os.path.join(REPO_ROOT, rel)],
                              capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 0, f"{rel}: {proc.stderr[-2000:]}"


#: scripts that finish in seconds on a tiny checkpoint (torch plan, a few frames): run for real, one
#: process; each must exit 0 and print the line it exists for (MODEL is the checkpoint's folder)
REAL_RUNS = {
    "benchmarks/ab_plans.py": (["--plan", "torch@QTTS_SPIN_US=0", "--pipelined-only", "--frames", "4", "--runs", "1",
                                "--silent-vocoder-too"], "threads 2) [silent vocoder]"),
    "benchmarks/bench_live.py": (
        ["--plan", "torch", "--rounds", "1", "--rates", "50", "--slow", "0", "--max-frames", "4"],
        "time to first audio, live 50 tok/s",
    ),  # fmt: skip
    "benchmarks/server_overhead.py": (["--rounds", "1", "--frames", "4"], "server/direct"),
    "benchmarks/perf/plan_rss.py": (["--plan", "torch", "--frames", "4"], "peak"),
    "benchmarks/perf/profile_plan.py": (["--plan", "torch", "--frames", "4", "--repeats", "1"], "talker"),
    "benchmarks/perf/torch_rows.py": (
        ["--streams", "2", "--frames", "3", "--rounds", "1"],
        "groups / one call",
    ),
    "benchmarks/perf/vocoder_stack.py": (["--sizes", "1", "--streams", "1,2", "--repeats", "1"], "| 1 | 2 |"),
    "benchmarks/perf/vocoder_int8_convs.py": (["--skip-speed", "--frames", "16", "--blocks", "234"],
                                              "k7 int8 in blocks 234 + rest bf16"),
}


def test_quick_benchmarks_run_on_a_tiny_checkpoint(tiny_snapshot):
    model = tiny_snapshot(kind="custom_voice")
    res = _sweep([[f, ["--model", model, *argv]] for f, (argv, _) in REAL_RUNS.items()])
    bad = {
        f: res[f] for f, (_, line) in REAL_RUNS.items() if res[f][0] not in (None, 0) or line not in res[f][1]
    }
    assert bad == {}, f"a benchmark failed on the tiny checkpoint or did not print its result: {bad}"
