"""Compare the outputs of ``benchmarks/arm_lane.py run`` on two machines (x86-64 and arm64): the
second half of ``python benchmarks/arm_lane.py compare X86_OUT ARM_OUT``.

Per precision: the greedy codes (equal, or the first divergent frame and codebook), the audio of
the same command on both sides (SNR of arm64 against x86-64, max |difference| in 16-bit steps),
and each side's own consistency: ``-o -`` PCM equals the WAV, ``qtts decode`` of the saved codes
equals the ``say`` WAV. Exit 1 when a command failed on either side or a check misses its bound.
"""

from __future__ import annotations

import json
import os

import numpy as np

#: SNR bound of arm64 audio against x86-64 audio for the same codes: both run the same fp32 vocoder
#: graph, only the kernels differ (NEON vs AVX-512 SnakeBeta, onnxruntime's MLAS per ISA), so the
#: difference is rounding (measured 96.5-97.3 dB, at most 1 step of 16 bits); 80 dB leaves a margin
MIN_SNR_DB = 80.0
AUDIO = (  # (file stem, what it is)
    ("say-{p}", "say --greedy"),
    ("decode-{p}", "decode of its codes"),
    ("decode-ref-{p}", "decode of the x86 codes (same vocoder input)"),
    ("say-fp32-seed", "say --seed 7 (sampled)"),
    ("say-fp32-plain", "say --greedy, QTTS_KERNELS=0"),
    ("serve-fp32", "serve POST (seed 7)"),
    ("wyoming-fp32", "wyoming synthesize (seed 7)"),
)


def _wav(path: str) -> np.ndarray | None:
    import soundfile as sf

    return sf.read(path, dtype="int16")[0] if os.path.exists(path) else None


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    err = float(((ref - got) ** 2).sum())
    return float("inf") if err == 0 else 10.0 * np.log10(float((ref**2).sum()) / err)


def code_diff(a: np.ndarray | None, b: np.ndarray | None) -> str:
    """'equal (N frames x 16)' or where the two [frames, 16] code arrays first differ."""
    if a is None or b is None:
        return "missing"
    if a.shape == b.shape and np.array_equal(a, b):
        return f"equal ({a.shape[0]} frames x {a.shape[1]})"
    n = min(len(a), len(b))
    rows = np.nonzero((a[:n] != b[:n]).any(axis=1))[0]
    if len(rows) == 0:
        return f"equal for {n} frames, then lengths differ ({len(a)} vs {len(b)})"
    f = int(rows[0])
    cb = int(np.nonzero(a[f] != b[f])[0][0])
    same = int((a[:n] == b[:n]).all(axis=1).sum())
    return f"first divergence at frame {f}, codebook {cb} ({same}/{n} frames equal)"


def _codes(out: str, name: str) -> np.ndarray | None:
    path = os.path.join(out, name)
    return np.load(path)["codes"] if os.path.exists(path) else None


def _audio_row(x86: str, arm: str, stem: str, what: str) -> tuple[list[str], bool]:
    x86_stem = stem.replace("decode-ref-", "decode-")  # the x86 side decoded those codes itself
    a, b = _wav(os.path.join(x86, x86_stem + ".wav")), _wav(os.path.join(arm, stem + ".wav"))
    if a is None or b is None:
        return [stem, what, "missing", "-", "-"], False
    if a.shape != b.shape:
        return [stem, what, f"lengths differ ({len(a)} vs {len(b)})", "-", "-"], False
    snr = snr_db(a, b)
    diff = int(np.abs(a.astype(np.int32) - b.astype(np.int32)).max())
    same = "identical" if diff == 0 else f"{snr:.1f} dB"
    return [stem, what, f"{len(a)} samples", same, str(diff)], snr >= MIN_SNR_DB


def _self_checks(out: str, precs: list[str]) -> list[str]:
    """Each side: the stdout PCM equals the WAV's samples, decode equals say."""
    lines = []
    for p in precs:
        wav = _wav(os.path.join(out, f"say-{p}.wav"))
        pcm_path = os.path.join(out, f"say-{p}.pcm")
        pcm = np.fromfile(pcm_path, dtype="<i2") if os.path.exists(pcm_path) else None
        dec = _wav(os.path.join(out, f"decode-{p}.wav"))
        ok_pcm = wav is not None and pcm is not None and np.array_equal(wav, pcm)
        ok_dec = wav is not None and dec is not None and np.array_equal(wav, dec)
        lines.append(f"{p}: stdout PCM {'==' if ok_pcm else '!='} WAV, decode {'==' if ok_dec else '!='} say")
    return lines


def compare(x86: str, arm: str, markdown: str | None = None) -> int:
    sides = {k: json.load(open(os.path.join(d, "results.json"), encoding="utf-8")) for k, d in (("x86", x86), ("arm", arm))}
    precs = sorted({r["name"].split()[1] for r in sides["arm"]["results"] if r["name"].startswith("say ")})
    ok = all(r["rc"] == 0 for s in sides.values() for r in s["results"])
    md = ["| check | x86-64 vs arm64 |", "|---|---|"]
    for p in precs:
        diff = code_diff(_codes(x86, f"codes-{p}.npz"), _codes(arm, f"codes-{p}.npz"))
        ok &= p != "fp32" or diff.startswith("equal (")  # fp32: the same codes; int8: reported (docs/arm.md)
        md.append(f"| {p} greedy codes | {diff} |")
    seeded = (_codes(x86, "codes-fp32-seed.npz"), _codes(arm, "codes-fp32-seed.npz"))
    if seeded[0] is not None and seeded[1] is not None:
        diff = code_diff(*seeded)
        ok &= diff.startswith("equal (")
        md.append(f"| fp32 seed 7 codes (sampled) | {diff} |")
    md += ["", "| audio | command | length | arm64 vs x86-64 SNR | max diff (16-bit steps) |", "|---|---|---|---|---|"]
    for stem, what in AUDIO:
        for p in precs if "{p}" in stem else [None]:
            row, good = _audio_row(x86, arm, stem.format(p=p), what)
            # int8 audio from diverged codes is other audio, reported only; the same codes are gated
            ok &= good or (row[0] in ("say-int8", "decode-int8"))
            md.append("| " + " | ".join(row) + " |")
    md.append("")
    for side, out in (("x86-64", x86), ("arm64", arm)):
        checks = _self_checks(out, precs)
        ok &= all("!=" not in c for c in checks)
        md.append(f"* {side}: " + "; ".join(checks))
    text = "\n".join(md)
    print(text)
    if markdown:
        with open(markdown, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0 if ok else 1
