"""The ``qtts`` command line: ``main(argv) -> exit code`` (0 ok, 2 bad input, 1 runtime failure).

Modules: ``main`` (parser, ``demo``, ``random-checkpoint``), ``say`` (``say``, ``voice``),
``serve``, ``export`` (``export``, ``verify``, ``bench``), ``common`` (shared flags and checks).
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
