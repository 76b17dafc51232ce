"""Import the official qwen-tts 0.1.1 package (``qtts bench --compare-official`` and the parity tests).

``import qwen_tts`` pulls in its 25 Hz tokenizer, whose module
imports sox and torchaudio at top level although the 12 Hz path never uses them. Missing ones are
replaced by empty modules with a ModuleSpec (transformers probes ``importlib.util.find_spec``).
Optional: needs ``pip install qwen-tts==0.1.1 --no-deps`` plus the ``reference`` extra.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

from ..errors import MissingDependencyError

_STUBS = ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


def _install_stubs() -> None:
    for name in _STUBS:
        if name in sys.modules:
            continue
        try:
            __import__(name)
        except ImportError:
            mod = types.ModuleType(name)
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
            mod.__qtts_stub__ = True
            sys.modules[name] = mod
    ta = sys.modules["torchaudio"]
    if getattr(ta, "__qtts_stub__", False):
        ta.compliance = sys.modules["torchaudio.compliance"]
        ta.compliance.kaldi = sys.modules["torchaudio.compliance.kaldi"]


MISSING = ("the official package is needed (parity tests, --compare-official): pip install -e \".[reference]\" "
           "&& pip install qwen-tts==0.1.1 --no-deps")


def check_installed() -> None:
    """Raise the install hint now, without importing it, when the official package or transformers is missing
    (``qtts bench --compare-official`` checks before minutes of benchmarking)."""
    import importlib.util

    if any(importlib.util.find_spec(name) is None for name in ("qwen_tts", "transformers")):
        raise MissingDependencyError(MISSING)


def qwen_tts():
    """The imported official ``qwen_tts`` package (stubs installed first)."""
    _install_stubs()
    try:
        import qwen_tts as pkg
    except ImportError as exc:
        raise MissingDependencyError(MISSING) from exc
    return pkg
