"""Import the official qwen-tts 0.1.1 package for parity tests.

The shim lives in :mod:`qtts.tools.official` (``import qwen_tts`` pulls in its 25 Hz tokenizer, which
imports sox and torchaudio at module level although the 12 Hz path never uses them; missing ones
are replaced by empty modules with a ModuleSpec). Tests use ``official.qwen_tts()``.
"""

from __future__ import annotations

from qtts.tools.official import qwen_tts

__all__ = ["qwen_tts"]
