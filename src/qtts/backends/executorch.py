"""The ExecuTorch runtime: ``.pte`` methods as numpy functions, and the streaming vocoder over one.

Needs the ``executorch`` package (the ``.venv-et`` environment, ``scripts/setup_executorch_env.sh``);
imported only by what runs a ``.pte`` (the exporter is :mod:`qtts.export.executorch`).
"""

from __future__ import annotations

import numpy as np

from ..errors import require
from .vocoder_step import StepVocoder


def load_method(path: str, threads: int | None = 1):
    """The ``forward`` method of a .pte (XNNPACK thread pool reset to ``threads``)."""
    rt = require("executorch.runtime", "executorch", "the ExecuTorch runtime")
    if threads:
        portable = require(
            "executorch.extension.pybindings.portable_lib", "executorch", "the ExecuTorch runtime"
        )
        portable._unsafe_reset_threadpool(int(threads))
    return rt.Runtime.get().load_program(path).load_method("forward")


def method_runner(method):
    """numpy-in/numpy-out ``run(*arrays)`` over an ExecuTorch method."""
    torch = require("torch", "export", "the ExecuTorch runtime")

    def run(*arrays):
        outs = method.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        return [o.numpy() for o in outs]

    return run


class EtVocoder(StepVocoder):
    """The streaming vocoder over one ExecuTorch vocoder step (zero-padded remainders)."""

    def __init__(self, path: str, contract, threads: int | None = 1):
        self._run_step = method_runner(load_method(path, threads))
        self.contract, self.sizes = contract, [contract.codes_length]

    def run(self, size, codes, freqs, valid, cache):
        audio, cache = self._run_step(codes, freqs, valid, cache)
        return audio, cache
