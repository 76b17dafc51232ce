"""The RKNN runtime (rknn-toolkit-lite2, on a Rockchip board): the vocoder step.

``.rknn`` files come from ``qtts export rknn``, each with its step contract in a ``<file>.json``
sidecar. Plan entry: ``{"vocoder": {"impl": "rknn", "artifacts": {"main": "voc16.rknn",
"first": "voc2.rknn"}, "options": {"core_mask": 1}}}``.
"""

from __future__ import annotations

import json
import os

from ..errors import InputError, QttsError, require
from .base import OpenContext
from .vocoder_step import StepContract, StepVocoder, pair_contracts


def read_rknn_contract(path: str) -> StepContract:
    """The contract of a .rknn step, from the ``<file>.json`` sidecar `qtts export rknn` writes."""
    side = path + ".json"
    if not os.path.isfile(side):
        raise InputError(f"{side}: missing; it is written by `qtts export rknn` next to the .rknn file")
    with open(side, encoding="utf-8") as fh:
        return StepContract.from_dict(json.load(fh), side)


class RknnVocoder(StepVocoder):
    """rknnlite runtimes for the ``main`` / ``first`` .rknn steps.

    ``runtime_factory()`` returns an object with the ``RKNNLite`` API (``load_rknn``,
    ``init_runtime``, ``inference(inputs=[...])``, ``release``); the default imports rknnlite.
    """

    def __init__(self, main: str, first: str | None = None, core_mask: int | None = None, runtime_factory=None):
        if runtime_factory is None:
            runtime_factory = require("rknnlite.api", "rknn", "the RKNN vocoder (on a Rockchip board)").RKNNLite
        paths = [main] + ([first] if first else [])
        contracts = {p: read_rknn_contract(p) for p in paths}
        self.contract = pair_contracts(contracts, main)
        self.runtimes = {contracts[p].codes_length: _start(runtime_factory(), p, core_mask) for p in paths}
        self.sizes = sorted(self.runtimes, reverse=True)

    def run(self, size, codes, freqs, valid, cache):
        outs = self.runtimes[size].inference(inputs=[codes, freqs, valid, cache])
        if outs is None or len(outs) != 2:
            raise QttsError("rknnlite inference returned no outputs")
        return outs[0], outs[1]

    def close(self) -> None:
        for rt in self.runtimes.values():
            rt.release()
        self.runtimes = {}


def _start(rt, path: str, core_mask: int | None):
    if rt.load_rknn(path) != 0:
        raise QttsError(f"{path}: rknnlite load_rknn failed")
    ret = rt.init_runtime() if core_mask is None else rt.init_runtime(core_mask=core_mask)
    if ret != 0:
        raise QttsError(f"{path}: rknnlite init_runtime failed ({ret}); is librknnrt.so installed on the board?")
    return rt


def open_vocoder(spec, ctx: OpenContext) -> RknnVocoder:
    """Plan options: ``core_mask`` (passed to ``RKNNLite.init_runtime``)."""
    return RknnVocoder(spec.artifacts["main"], spec.artifacts.get("first"), spec.options.get("core_mask"))


OPENERS = {"vocoder": open_vocoder}
