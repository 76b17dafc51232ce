"""Import the official qwen-tts 0.1.1 package for parity tests.

``import qwen_tts`` pulls in its 25 Hz tokenizer, which imports sox, onnxruntime's old API
and torchaudio at module level; the 12 Hz path never uses them. We register empty stand-in
modules (with a ModuleSpec, because transformers probes importlib.util.find_spec) for the
ones that are not importable, then import the package. Only tests import this file.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

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


def qwen_tts():
    """Return the imported official ``qwen_tts`` package (stubs installed first)."""
    _install_stubs()
    import qwen_tts as pkg

    return pkg
