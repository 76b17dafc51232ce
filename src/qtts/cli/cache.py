"""``qtts cache ls|build|rm``: the plans built for checkpoints (:mod:`qtts.plans.cache`)."""

from __future__ import annotations

import os
import shutil

from ..errors import InputError
from .common import command, group


def register(sub) -> None:
    c = group(sub, "cache", "list, build or remove the cached plans (ONNX bundles per checkpoint and preset)")
    command(c, "ls", run_ls, "list the cached plans: size, preset, checkpoint")
    b = command(c, "build", run_build, "build a preset's plan for a checkpoint now (so a later start finds it)")
    b.add_argument("-m", "--model", required=True, metavar="MODEL", help="snapshot directory or hub id")
    b.add_argument("--plan", default=None, metavar="PRESET", help="fast (default), faithful or fastest")
    r = command(c, "rm", run_rm, "remove cached plans (with no selector: none; --all: every one)")
    r.add_argument("keys", nargs="*", metavar="KEY", help="names from qtts cache ls")
    r.add_argument("-m", "--model", metavar="MODEL", help="the plans of this checkpoint")
    r.add_argument("--plan", metavar="PRESET", help="the plans of this preset")
    r.add_argument("--all", action="store_true", help="every cached plan, and unfinished builds")


def entries(root: str | None = None) -> list[dict]:
    """One dict per folder under the cache's bundles/: key, path, size, preset, model, state."""
    from ..plans import cache

    base = cache.bundles_dir(root)
    out = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        if not os.path.isdir(path):
            continue
        info = cache.read_info(path)
        done = not name.startswith(".") and os.path.isfile(os.path.join(path, "plan.json"))
        out.append({"key": name, "path": path, "bytes": _size(path), "preset": info.get("preset", "?"),
                    "model": info.get("model", "?"), "fingerprint": info.get("fingerprint", name.split("-")[0]),
                    "qtts_version": info.get("qtts_version", "?"), "built": info.get("built", ""),
                    "state": "ready" if done else "unfinished"})  # fmt: skip
    return out


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def disk_bytes(paths) -> int:
    """Bytes on disk under ``paths``, each hard-linked file (shared between presets) counted once."""
    seen = {}
    for path in paths:
        for r, _, fs in os.walk(path):
            for f in fs:
                st = os.stat(os.path.join(r, f))
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def run_ls(args) -> int:
    from ..plans import cache

    rows = entries()
    total = disk_bytes(r["path"] for r in rows)
    print(f"plan cache: {cache.cache_root()} ({total / 1e9:.2f} GB on disk in {len(rows)} plan(s); files "
          "that presets of one checkpoint share are stored once)")
    for r in rows:
        state = "" if r["state"] == "ready" else "  [unfinished build: qtts cache rm --all removes it]"
        print(f"{r['bytes'] / 1e6:9.1f} MB  {r['preset']:<9} {r['model']}  (fingerprint {r['fingerprint']}, "
              f"qtts {r['qtts_version']}, {r['built'] or '-'})  {r['key']}{state}")
    return 0


def run_build(args) -> int:
    from ..backends import snapshot_dir
    from ..plans import cache

    preset = cache.preset_name(args.plan or cache.DEFAULT_PRESET)
    if preset is None:
        raise InputError(f"--plan {args.plan}: not a preset; use one of {', '.join(cache.PRESETS)}")
    path = cache.bundle_plan(snapshot_dir(args.model), preset, no_build=False)
    print(f"plan '{preset}' for {args.model}: {path}")
    return 0


def run_rm(args) -> int:
    from ..backends import snapshot_dir
    from ..plans.cache import PRESETS, REFUSED, bundles_dir, preset_name
    from ..plans.plan import fingerprint

    if not (args.keys or args.model or args.plan or args.all):
        raise InputError("say what to remove: KEY (from qtts cache ls), -m MODEL, --plan PRESET or --all")
    preset = preset_name(args.plan) if args.plan else None
    if args.plan and preset is None:
        raise InputError(f"--plan {args.plan}: not a preset; use one of {', '.join(PRESETS)}")
    rows = entries()
    unknown = sorted(set(args.keys) - {r["key"] for r in rows})
    if unknown:
        raise InputError(f"no cached plan named {', '.join(unknown)}; qtts cache ls lists the names")
    fp = fingerprint(snapshot_dir(args.model)) if args.model else None
    removed = 0
    for r in rows:
        chosen = args.all or (
            (not args.keys or r["key"] in args.keys) and (fp is None or r["fingerprint"] == fp)
            and (preset is None or r["preset"] == preset)
        )  # fmt: skip
        if chosen:
            shutil.rmtree(r["path"])
            removed += 1
            print(f"removed {r['key']} ({r['bytes'] / 1e6:.1f} MB, {r['preset']}, {r['model']})")
    for name in sorted(os.listdir(bundles_dir())) if args.all and os.path.isdir(bundles_dir()) else []:
        if name.endswith(REFUSED):  # the exporter's remembered refusals: the next default load tries again
            os.remove(os.path.join(bundles_dir(), name))
            print(f"forgot the exporter's refusal {name}")
    if not removed:
        print("nothing matched; qtts cache ls lists what is cached")
    return 0
