"""Fast by default: the plan a load runs when it is given none, from a cache of built ONNX bundles.

:func:`resolve_plan` turns what a caller passed as ``plan`` into what :func:`qtts.backends.open`
loads: ``"torch"`` -> the torch fp32 reference; a preset name (:data:`PRESETS`) -> that preset's
bundle for this checkpoint; ``None`` -> ``$QTTS_PLAN`` if set, else the :data:`DEFAULT_PRESET`;
anything else is a plan file path (or a dict / Plan), as before.

A preset's bundle lives in ``$QTTS_CACHE`` (default ``~/.cache/qtts``) under
``bundles/<fingerprint>-<preset>-<key>``: the checkpoint fingerprint (:func:`qtts.bundle.fingerprint`),
the preset, and a hash of everything else the bundle depends on (:func:`cache_key`: the qtts version,
:data:`FORMAT`, the onnxruntime version that quantizes and runs it, the preset's export options).
A missing bundle is built once (:func:`build` here: a key lock, a staging folder renamed when
complete) when the export extra is installed, unless ``no_build`` / ``$QTTS_NO_BUILD=1``, which make
it an error naming the command that builds it. The export itself runs in a child process
(:mod:`qtts.plans.build`): this process never imports ``qtts.export`` or torch to build, and the
child's memory goes back to the system when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import filecmp
import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
from dataclasses import asdict, dataclass

from ..errors import InputError, QttsError
from .plan import Plan, fingerprint

log = logging.getLogger(__name__)

TORCH = "torch"
ENV_CACHE, ENV_PLAN, ENV_NO_BUILD = "QTTS_CACHE", "QTTS_PLAN", "QTTS_NO_BUILD"
#: bump when the layout of a cached bundle changes in a way a version bump would not show (not when
#: only its graphs get leaner with the same outputs: issue 24's fewer-node graphs give bit-identical
#: codes and logits, so a bundle cached before them stays valid and is not rebuilt)
FORMAT = 1
INFO = "cache.json"  # beside plan.json: what the cache knows of the bundle (preset, checkpoint, versions)
INSTALL_EXPORT = 'pip install -e ".[export]"'
#: ``bundles/<key>.refused``: why the exporter refused that checkpoint; the default plan then runs
#: torch without trying again (the key changes with qtts and onnxruntime; ``qtts cache rm --all`` removes it)
REFUSED = ".refused"


@dataclass(frozen=True)
class Preset:
    """A named export recipe (:class:`qtts.export.onnx.ExportOptions` fields)."""

    #: weight precision of the talker and of the predictor
    talker: str
    predictor: str
    #: storage of the gathered embedding tables (fp16 halves the 1.24 GB fp32 text embedding, int8 quarters it)
    tables: str
    #: MatMulNBits block size (128: the fastest; docs/fidelity.md for what it costs)
    block_size: int = 128
    #: repairs of the quantized weights (``qtts export onnx --repair``): "rotate" = Hadamard-rotated
    #: graphs (qtts.export.rotate), which spread real weights' outlier channels before quantizing
    repair: str = ""
    #: one line for ``qtts cache ls`` and the docs
    summary: str = ""


PRESETS = {
    "faithful": Preset("fp32", "fp32", "fp32", summary="fp32 ONNX: the torch reference's codes, faster"),
    "fast": Preset("int8", "int8", "int8", repair="rotate",
                   summary="int8 weights (block 128, Hadamard-rotated), int8 tables: the default"),
    "fastest": Preset("int4", "int4", "int8", repair="rotate",
                      summary="int4 weights (block 128, Hadamard-rotated): fails the fidelity gate, opt-in"),
}
#: the preset the rule in docs/fidelity.md picks: the fastest one whose teacher-forced talker and
#: predictor logits stay >= 25 dB at full size and that streams at RTF <= 0.9 on a 2-core CPU
DEFAULT_PRESET = "fast"
ALIASES = {"default": DEFAULT_PRESET}


def cache_root() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get(ENV_CACHE) or os.path.join("~", ".cache", "qtts")))


def bundles_dir(root: str | None = None) -> str:
    return os.path.join(root or cache_root(), "bundles")


def runtime_version() -> str:
    """The installed onnxruntime's version (it quantizes the bundle and runs it)."""
    from importlib import metadata

    for dist in ("onnxruntime", "onnxruntime-qnn", "onnxruntime-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def cache_key(fingerprint: str, preset: str) -> str:
    """``<fingerprint>-<preset>-<hash>``: another checkpoint, preset, qtts version, format or
    onnxruntime version never shares a bundle."""
    from ..version import __version__

    deps = {"qtts": __version__, "format": FORMAT, "onnxruntime": runtime_version(),
            "preset": asdict(PRESETS[preset])}  # fmt: skip
    digest = hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:10]
    return f"{fingerprint}-{preset}-{digest}"


def preset_name(plan) -> str | None:
    """The preset a ``plan`` argument names (aliases resolved), else None (a path, dict, Plan)."""
    if not isinstance(plan, str):
        return None
    name = ALIASES.get(plan, plan)
    return name if name in PRESETS and not os.path.exists(plan) else None


def check_plan_name(plan) -> None:
    """A ``plan`` string that is neither 'torch', a preset nor an existing path: an error naming the choices."""
    if isinstance(plan, str) and plan != TORCH and preset_name(plan) is None and not os.path.exists(plan):
        looks = "plan file not found" if plan.endswith(".json") or os.sep in plan else "no such preset or plan file"
        raise InputError(f"plan={plan!r}: {looks}; use a preset ({', '.join(PRESETS)}), {TORCH!r} "
                         "(the fp32 reference) or the path of an exported bundle's plan.json")


def env_no_build() -> bool:
    return os.environ.get(ENV_NO_BUILD, "").strip().lower() not in ("", "0", "false", "no")


def resolve_plan(plan, snapshot: str, dtype: str = "float32", backend=None, no_build: bool | None = None,
                 listeners: tuple = ()):
    """What ``plan`` means for the checkpoint at ``snapshot`` (see the module docstring): a Plan,
    a dict or a plan file path. ``listeners`` get ``(percent, phase)`` while a bundle is built."""
    if plan is None:
        plan = os.environ.get(ENV_PLAN) or None
        if plan is None and (dtype != "float32" or backend is not None):
            return Plan()  # a torch dtype, or an injected generation backend: the torch parts as before
        if plan is None:
            return _default(snapshot, no_build, listeners)
    if plan == TORCH:
        return Plan()
    name = preset_name(plan)
    if name is None:
        check_plan_name(plan)
        return plan
    return bundle_plan(snapshot, name, no_build=no_build, listeners=listeners)


EXPORT_MODULES = ("torch", "onnx", "onnx_ir")


def export_missing() -> str | None:
    """The first module building a bundle needs that is not installed, or None."""
    import importlib.util

    for module in EXPORT_MODULES:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def _default(snapshot: str, no_build, listeners):
    """The default preset's bundle. With torch installed and no bundle cached, the torch reference,
    said in one warning, when the export extra is missing or the exporter refuses this checkpoint
    (an explicit ``--plan fast`` fails instead: the caller asked for that plan)."""
    found = find_bundle(snapshot, DEFAULT_PRESET)
    if found is not None:
        return bundle_plan(snapshot, DEFAULT_PRESET, found=found)
    missing = export_missing()
    if missing and _has_torch():
        log.warning("qtts: no cached '%s' plan for %s and %s is not installed to build it: running the "
                    "torch fp32 reference (slow); %s builds the fast plan once (--plan torch: no notice)",
                    DEFAULT_PRESET, snapshot, missing, INSTALL_EXPORT)
        return Plan()
    marker = os.path.join(bundles_dir(), f"{cache_key(fingerprint(snapshot), DEFAULT_PRESET)}{REFUSED}")
    refusal = _read_text(marker)
    if refusal is None and (env_no_build() if no_build is None else no_build):
        return bundle_plan(snapshot, DEFAULT_PRESET, no_build=True)  # the error naming qtts cache build
    if refusal is None:
        try:
            return build(snapshot, DEFAULT_PRESET, listeners)
        except InputError as exc:  # the exporter refuses this checkpoint (torch is there: export_missing is None)
            if missing:
                raise
            refusal = str(exc)
            with contextlib.suppress(OSError):  # remembered, so the next load does not try again
                with open(marker, "w", encoding="utf-8") as fh:
                    fh.write(refusal)
    log.warning("qtts: the '%s' plan cannot be built for %s (%s): running the torch fp32 reference (slow); "
                "--plan torch: no notice", DEFAULT_PRESET, snapshot, refusal)
    return Plan()


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def find_bundle(snapshot: str, preset: str, root: str | None = None) -> str | None:
    """The plan.json of the cached bundle of ``preset`` for this checkpoint, or None."""
    path = os.path.join(bundles_dir(root), cache_key(fingerprint(snapshot), preset), "plan.json")
    return path if os.path.isfile(path) else None


def bundle_plan(snapshot: str, preset: str, no_build: bool | None = None, listeners: tuple = (), found=None) -> str:
    """The plan.json of ``preset``'s bundle for ``snapshot`` (``found``: already looked up), built first when missing."""
    found = found or find_bundle(snapshot, preset)
    if found is not None:
        log.info("qtts: plan '%s' from the cache: %s", preset, os.path.dirname(found))
        return found
    no_build = env_no_build() if no_build is None else no_build
    if no_build:
        raise InputError(
            f"no cached '{preset}' plan for {snapshot} and building is off (--no-build / {ENV_NO_BUILD}=1); "
            f"build it first with: qtts cache build -m {snapshot} --plan {preset}, or pass --plan torch"
        )
    return build(snapshot, preset, listeners)


def plan_label(plan: Plan) -> str:
    """What runs, for logs and /health: 'fast (onnx: talker int8, predictor int8, vocoder fp32)'."""
    specs = [(name, plan.get(name)) for name in ("talker", "predictor", "vocoder")]
    impls = {spec.impl for _, spec in specs}
    if impls == {"torch"}:
        return "torch fp32 reference"
    parts = ", ".join(f"{name} {spec.precision or 'fp32'}" if len(impls) == 1 else
                      f"{name} {spec.impl} {spec.precision or 'fp32'}" for name, spec in specs)  # fmt: skip
    body = f"{impls.pop()}: {parts}" if len(impls) == 1 else parts
    info = read_info(os.path.dirname(plan.path)) if plan.path else {}
    name = info.get("preset") or (f"plan {plan.path}" if plan.path else "plan")
    return f"{name} ({body})"


def plan_short(plan: Plan) -> str:
    """'fast', 'torch' or the plan file: the summary line's ``plan=``."""
    if all(plan.get(name).impl == "torch" for name in ("talker", "predictor", "vocoder")):
        return TORCH
    return (read_info(os.path.dirname(plan.path)).get("preset") if plan.path else None) or str(plan.path or "plan")


def read_info(bundle: str) -> dict:
    try:
        with open(os.path.join(bundle, INFO), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


# ----------------------------------------------------------------------------- building once
def build(snapshot: str, preset: str, listeners: tuple = ()) -> str:
    """Build ``preset``'s bundle for ``snapshot`` into the cache (or a temp folder); its plan.json."""
    missing = export_missing()
    if missing:
        raise InputError(
            f"no cached '{preset}' plan for {snapshot}, and building one needs {missing}: install the export "
            f"extra ({INSTALL_EXPORT}), or pass --plan PATH/plan.json of an exported bundle"
            + ("" if missing == "torch" else ", or --plan torch")
        )
    key = cache_key(fingerprint(snapshot), preset)
    root = bundles_dir()
    try:
        lock = _prepare(root, key)
    except OSError as exc:
        log.warning("qtts: the plan cache %s is not writable (%s): building the '%s' plan into a temporary "
                    "folder for this run only (set %s to a writable folder to keep it)",
                    cache_root(), exc.strerror or exc, preset, ENV_CACHE)
        return _build_temporary(snapshot, preset, key, listeners)
    with lock:
        final = os.path.join(root, key)
        if os.path.isfile(os.path.join(final, "plan.json")):  # another process built it while we waited
            log.info("qtts: plan '%s' built by another process: %s", preset, final)
            return os.path.join(final, "plan.json")
        _remove_stale(root, key)
        staging = os.path.join(root, f".{key}.{secrets.token_hex(4)}.part")
        os.mkdir(staging)
        try:
            bundle = _export(snapshot, preset, os.path.join(staging, "bundle"), listeners)
            _link_shared(root, key, bundle)
            if os.path.isdir(final):  # an incomplete folder of that name (no plan.json): replace it
                shutil.rmtree(final)
            os.replace(bundle, final)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            return _full(preset, exc)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return os.path.join(final, "plan.json")


def _full(preset: str, exc: OSError):
    """The cache filled up during the build: torch, with one warning (or an error without torch)."""
    if export_missing() == "torch":
        raise QttsError(f"no space left in the plan cache {cache_root()} to build the '{preset}' plan "
                        f"({exc.strerror}); free some space or set {ENV_CACHE} to another folder")
    log.warning("qtts: no space left in the plan cache %s to build the '%s' plan (%s): running the torch fp32 "
                "reference instead (free some space or set %s to another folder)", cache_root(), preset,
                exc.strerror, ENV_CACHE)
    return Plan()


def _prepare(root: str, key: str):
    """Create the cache folders and open the key's lock (raises OSError when it cannot)."""
    os.makedirs(root, exist_ok=True)
    locks = os.path.join(os.path.dirname(root), "locks")
    os.makedirs(locks, exist_ok=True)
    if not os.access(root, os.W_OK):
        raise PermissionError(13, "Permission denied", root)
    return _Lock(os.path.join(locks, key + ".lock"))


class _Lock:
    """An exclusive ``flock`` on a file; where flock does not exist (Windows), no lock."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def __enter__(self):
        try:
            import fcntl
        except ImportError:
            return self
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("qtts: another process is building this plan (%s); waiting for it", self.path)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the flock
        return False


def _remove_stale(root: str, key: str) -> None:
    """Staging folders of this key left by a killed build (we hold the key's lock: none is live)."""
    for name in os.listdir(root):
        if name.startswith(f".{key}.") and name.endswith(".part"):
            log.info("qtts: removing an unfinished build: %s", name)
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _link_shared(root: str, key: str, bundle: str) -> None:
    """Files identical to a file of the same name in another preset's bundle of this checkpoint (the
    vocoder, the encoders, tables) become hard links to it: one copy on disk, and removing
    either bundle leaves the other whole."""
    fp = key.split("-")[0]
    siblings = [os.path.join(root, n) for n in os.listdir(root) if n.startswith(fp + "-") and n != key]
    for dirpath, _, files in os.walk(bundle):
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, bundle)
            for other in (os.path.join(s, rel) for s in siblings):
                if os.path.isfile(other) and os.path.getsize(other) == os.path.getsize(path) and \
                        filecmp.cmp(other, path, shallow=False):
                    with contextlib.suppress(OSError):  # no hard links here (another filesystem): keep the copy
                        tmp = path + ".link"
                        os.link(other, tmp)
                        os.replace(tmp, path)
                    break


def _build_temporary(snapshot: str, preset: str, key: str, listeners: tuple) -> str:
    tmp = tempfile.mkdtemp(prefix="qtts-plan-")
    atexit.register(shutil.rmtree, tmp, True)
    try:
        return os.path.join(_export(snapshot, preset, os.path.join(tmp, key), listeners), "plan.json")
    except OSError as exc:
        raise QttsError(f"cannot build the '{preset}' plan in a temporary folder either ({exc}); free some disk "
                        "space, set QTTS_CACHE to a writable folder, or pass --plan torch") from exc


def _export(snapshot: str, preset: str, out: str, listeners: tuple) -> str:
    """Export ``preset`` into ``out`` in a child process with progress, and its cache info; returns ``out``."""
    from ..version import __version__
    from .build import run_child
    p = PRESETS[preset]
    info = {"preset": preset, "model": snapshot, "fingerprint": fingerprint(snapshot), "qtts_version": __version__,
            "format": FORMAT, "onnxruntime": runtime_version()}  # fmt: skip
    options = {"talker": p.talker, "predictor": p.predictor, "block_size": p.block_size, "tables": p.tables,
               "repair": p.repair}  # fmt: skip
    return run_child(snapshot, out, options, info, os.path.join(out, INFO), f"the '{preset}' plan", listeners)
