"""Error types. The CLI maps InputError to exit code 2 and QttsError to exit code 1."""


class QttsError(RuntimeError):
    """A runtime failure (exit code 1)."""


class InputError(ValueError):
    """Bad user input: a wrong argument, file, mode or value (exit code 2).

    Messages name the problem and the fix.
    """


class ConfigError(InputError):
    """A snapshot config file is missing, malformed, or lacks a required key."""


class MissingDependencyError(QttsError, ImportError):
    """An optional dependency (an extra) is not installed; the message says how to install it."""


def require(module: str, extra: str, what: str = ""):
    """Import an optional module lazily, or raise MissingDependencyError with an install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, extra, what) from exc


#: what a command that can run an exported bundle says after a missing torch
BUNDLE_HINT = " (or run an exported ONNX bundle, which needs no torch: --plan BUNDLE/plan.json)"


def missing(module: str, extra: str, what: str = "", also: str = "") -> MissingDependencyError:
    """The error :func:`require` raises for ``module`` (for a module imported at the top of a
    file that only an optional path imports: ``raise missing(...) from exc``); ``also``: an
    alternative appended to the hint (:data:`BUNDLE_HINT`)."""
    purpose = f" for {what}" if what else ""
    return MissingDependencyError(f"'{module}' is needed{purpose} but is not installed; "
                                  f"install it with: {install_hint(extra)}{also}")


#: the extra that provides each optional top-level module (pyproject.toml)
EXTRAS = {"torch": "torch", "onnx": "export", "onnx_ir": "export", "onnxscript": "export", "fastapi": "serve",
          "uvicorn": "serve", "websockets": "serve", "multipart": "serve", "python_multipart": "serve",
          "wyoming": "wyoming", "huggingface_hub": "hub", "ray": "ray", "matplotlib": "plot"}


def install_hint(extra: str) -> str:
    """The install command of an extra. qtts is not on PyPI: it installs from its checkout."""
    return f'pip install -e ".[{extra}]" (in the qtts checkout)'


def missing_module_message(exc: ImportError, extra: str | None = None, bundle: bool = False) -> str | None:
    """One line for an ImportError of an optional module (``import torch`` on a core-only
    install), naming the extra that provides it (``extra``: the one a command needs, when it
    needs more than that module); None for any other ImportError (a bug). ``bundle``: the command
    also runs an exported ONNX bundle, which needs no torch."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if name not in EXTRAS:
        return None
    extra = extra or EXTRAS[name]
    need = "PyTorch" if name == "torch" else f"'{name}'"
    also = BUNDLE_HINT if name == "torch" and bundle else ""
    return f"{need} is needed for this command but is not installed; install it with: {install_hint(extra)}{also}"
