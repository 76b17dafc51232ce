"""``qtts kernels build|status``: the optional compiled kernel library (:mod:`qtts.kernels`)."""

from __future__ import annotations

import os

from ..errors import QttsError
from .common import command, group


def register(sub) -> None:
    k = group(sub, "kernels", "build or inspect the optional compiled kernels (vocoder SnakeBeta, predictor DecoderLayer)")
    b = command(k, "build", run_build, "compile the kernels with the system C compiler now (cached in $QTTS_CACHE)")
    b.add_argument("--force", action="store_true", help="rebuild even if a library or a failed build is cached")
    command(k, "status", run_status, "say whether the kernels are built, where, and which code path this CPU gets")


def run_build(args) -> int:
    from .. import kernels

    result = kernels.build(force=args.force)
    if result.path is None:
        raise QttsError(f"the kernels did not build: {result.reason}; the plain vocoder graph runs instead")
    how = f"built ({result.selftest})" if result.fresh else "already built"
    print(f"{result.path}: {how}; code path {kernels.isa(result.path)}")
    if not kernels.enabled():
        print(f"note: {kernels.ENV}=0 is set, so qtts does not use them")
    return 0


def run_status(args) -> int:
    from .. import kernels

    folder = os.path.join(kernels.kernels_root(), kernels.build_key(kernels.compiler()))
    lib, failed = os.path.join(folder, kernels.library_name()), os.path.join(folder, kernels.FAILED)
    if os.path.isfile(lib):
        from ..kernels.layer import isa as layer_isa

        print(f"built: {lib} (code path {kernels.isa(lib)}; DecoderLayer int8 path {layer_isa(lib)})")
    elif os.path.isfile(failed):
        with open(failed, encoding="utf-8") as fh:
            print(f"failed: {fh.read().strip()} ('qtts kernels build --force' retries)")
    else:
        print("not built yet: the first ONNX plan builds it, or run 'qtts kernels build'")
    print(f"{kernels.ENV}={'on' if kernels.enabled() else 'off (the plain graph runs)'}")
    return 0
