"""The runtime (model files, loader, random checkpoints) works with ``transformers`` unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    sys.modules["transformers"] = None  # any 'import transformers' now raises ImportError
    sys.modules["qwen_tts"] = None
    import qtts, qtts.weights, qtts.tools.random_checkpoint, qtts.model
    names = [m.name for m in pkgutil.iter_modules(qtts.model.__path__)]
    for name in names:
        importlib.import_module("qtts.model." + name)
    for optional in ("qtts.api", "qtts.engine.generate", "qtts.text.tokenizer", "qtts.text.prompt"):
        if importlib.util.find_spec(optional) is not None:
            importlib.import_module(optional)
    from qtts.tools.random_checkpoint import write_random_checkpoint
    from qtts.weights import load_checkpoint
    out = write_random_checkpoint(sys.argv[1], kind="base", layout="1.7b")
    ckpt = load_checkpoint(out)
    assert ckpt.model.speaker_encoder is not None and ckpt.speech_tokenizer.decoder is not None
    assert "transformers" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
    print("OK", len(names))
    """
)


def test_runtime_imports_without_transformers(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "snap")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK")
