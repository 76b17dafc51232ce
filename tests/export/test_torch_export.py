"""How qtts runs torch's ONNX exporter: without its IR self-check (``_jit_pass_lint``: same bytes,
restored after, opt-out) and in a fresh thread (the tracer records the Python stack of every node)."""

import functools
import inspect
import os
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from qtts.export import write  # noqa: E402
from qtts.export.onnx import export_talker  # noqa: E402
from qtts.weights import load_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def talker(snapshot):
    return load_checkpoint(snapshot, components=("talker",)).model.talker


def _files(folder: str) -> dict:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as fh:
            out[name] = fh.read()
    return out


@pytest.fixture
def counted_lint(monkeypatch):
    """torch's lint replaced by one that counts its calls (then calls the real one)."""
    real, calls = torch._C._jit_pass_lint, []

    def lint(graph):
        calls.append(1)
        return real(graph)

    monkeypatch.setattr(write, "_LINT", {})
    monkeypatch.setattr(torch._C, "_jit_pass_lint", lint)
    return calls


def test_the_talker_graph_is_the_same_bytes_with_and_without_the_lint(talker, tmp_path, monkeypatch, counted_lint):
    os.makedirs(tmp_path / "plain")
    os.makedirs(tmp_path / "linted")
    export_talker(talker, str(tmp_path / "plain" / "talker.onnx"))
    assert counted_lint == []  # skipped by default
    monkeypatch.setenv(write.LINT_ENV, "1")
    export_talker(talker, str(tmp_path / "linted" / "talker.onnx"))
    assert len(counted_lint) >= 5  # QTTS_EXPORT_LINT=1 keeps it (ten calls a graph in torch 2.13)
    plain, linted = _files(str(tmp_path / "plain")), _files(str(tmp_path / "linted"))
    assert sorted(plain) == sorted(linted) == ["talker.onnx", "talker.onnx.data"]
    assert plain == linted


def test_the_real_lint_is_back_after_an_export_and_after_an_error(counted_lint):
    lint = torch._C._jit_pass_lint
    with write.without_ir_lint(torch):
        assert torch._C._jit_pass_lint is not lint
    assert torch._C._jit_pass_lint is lint
    with pytest.raises(RuntimeError, match="boom"):
        with write.without_ir_lint(torch):
            with write.without_ir_lint(torch):  # nested (or another thread's) use restores the real one
                raise RuntimeError("boom")
    assert torch._C._jit_pass_lint is lint and counted_lint == []


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_env_keeps_the_lint_in_place(value, monkeypatch, counted_lint):
    monkeypatch.setenv(write.LINT_ENV, value)
    lint = torch._C._jit_pass_lint
    with write.without_ir_lint(torch):
        assert torch._C._jit_pass_lint is lint


def test_in_fresh_thread_returns_and_raises_in_the_caller():
    caller = threading.get_ident()
    assert write.in_fresh_thread(lambda: threading.get_ident()) != caller
    assert write.in_fresh_thread(lambda: 42) == 42
    error = ValueError("from the worker")

    def fail():
        raise error

    with pytest.raises(ValueError) as info:
        write.in_fresh_thread(fail)
    assert info.value is error


class _StackDepth(torch.nn.Module):
    """Records how deep the Python stack is while torch traces it."""

    def __init__(self):
        super().__init__()
        self.depths = []

    def forward(self, x):
        self.depths.append(len(inspect.stack(0)))
        return x * 2 + 1


def _at_depth(n: int, fn):
    return fn() if n == 0 else _at_depth(n - 1, fn)


def test_the_tracer_sees_the_same_stack_from_any_caller_depth(tmp_path):
    """The caller's frames are not in the stack the tracer walks for each node."""
    module, args = _StackDepth(), (torch.zeros(2, 3),)
    for depth, name in ((0, "shallow"), (150, "deep")):
        _at_depth(depth, functools.partial(write.export_graph, module, args, str(tmp_path / f"{name}.onnx"),
                                           ["x"], ["y"], {}))  # fmt: skip
    assert len(module.depths) >= 2 and len(set(module.depths)) == 1, module.depths
    assert module.depths[0] < 150
    files = _files(str(tmp_path))
    assert files["shallow.onnx"] == files["deep.onnx"]
