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
        purpose = f" for {what}" if what else ""
        raise MissingDependencyError(
            f"'{module}' is needed{purpose} but is not installed; "
            f"install it with: pip install 'qtts[{extra}]'"
        ) from exc
