"""Is our GGUF conversion faithful? The peer (qwentts.cpp) vs qtts, greedy, same prompt.

    .venv-peer/bin/python benchmarks/peer_check.py --model CKPT --gguf-dir DIR [--variant F32] [--frames 8]

Runs the peer greedy (temperature 0: argmax, no repetition penalty) on ``talker/codec-<variant>.gguf``
with its debug dump (``codes-full.bin``), then qtts greedy (torch fp32, same rule) on the checkpoint
in the main venv (--qtts-python), with the peer's prompt layout: the whole text in the prefill
(``non_streaming_text=True``; the peer always builds that layout), language 'auto', the benchmark's
x-vector. Prints codes equality (exit 0 = equal), the first differing frame, the code match rate,
and the SNR of the peer's streamed audio against qtts's decode of qtts's codes over the
frames before the first differing one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peer import (  # noqa: E402  (a sibling script module)
    HOP,
    ROOT,
    TEXT,
    XVEC_SCALE,
    XVEC_SEED,
    InputError,
    add_common,
    ensure_ggufs,
    open_peer,
    peer_run,
    write_json,
)


def check(args) -> int:
    """Greedy: the peer on our GGUF vs qtts (torch fp32) on the checkpoint; codes must be equal."""
    talker, codec = ensure_ggufs(args, args.variant)
    tts, lines, cond = open_peer(talker, codec, args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        run = peer_run(tts, lines, cond, args.frames, seed=0, greedy=True, dump_dir=tmp)
        tts.close()  # free its weights before qtts loads the checkpoint
        peer_codes = read_dump(Path(tmp) / "codes-full.bin").astype(np.int64)
        ref = Path(tmp) / "qtts.npz"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        cmd = [args.qtts_python, __file__, "--model", str(args.model), "--gguf-dir", str(args.gguf_dir),
               "--frames", str(args.frames), "--threads", str(args.threads), "--qtts-reference", str(ref)]  # fmt: skip
        subprocess.run(cmd, check=True, env=env)
        with np.load(ref) as z:
            codes, pcm = z["codes"], z["pcm"]
    report = compare(peer_codes, run["pcm"], codes, pcm)
    report.update(variant=args.variant, frames_requested=args.frames, model=str(args.model))
    print(json.dumps(report, indent=1))
    if args.json:
        write_json(args.json, report)
    return 0 if report["codes_equal"] else 1


def read_dump(path: Path) -> np.ndarray:
    """The peer's debug dump: int32 ndims, int32 shape[ndims], float32 data."""
    raw = path.read_bytes()
    nd = int(np.frombuffer(raw[:4], np.int32)[0])
    shape = np.frombuffer(raw[4 : 4 + 4 * nd], np.int32)
    return np.frombuffer(raw[4 + 4 * nd :], np.float32).reshape(shape)


def compare(peer_codes, peer_pcm, codes, pcm) -> dict:
    """Codes frame by frame; audio SNR over the frames before the first differing one (the decoder
    is causal, so that prefix of audio depends only on equal codes)."""
    n = min(len(peer_codes), len(codes))
    diff = np.nonzero((peer_codes[:n] != codes[:n]).any(axis=1))[0]
    same = int(diff[0]) if len(diff) else n
    m = min(len(peer_pcm), len(pcm), same * HOP)
    err = float(np.sum((peer_pcm[:m] - pcm[:m]) ** 2))
    snr = 10 * np.log10(float(np.sum(pcm[:m] ** 2)) / max(err, 1e-30)) if m else None
    return {"frames_peer": int(len(peer_codes)), "frames_qtts": int(len(codes)),
            "codes_equal": bool(n > 0 and len(diff) == 0 and len(peer_codes) == len(codes)),
            "first_mismatch_frame": int(diff[0]) if len(diff) else None,
            "code_match_rate": float((peer_codes[:n] == codes[:n]).mean()) if n else 0.0,
            "audio_snr_db": round(snr, 1) if snr is not None else None, "audio_frames_compared": m // HOP}  # fmt: skip


def qtts_reference(args) -> int:
    """[main venv] qtts greedy codes for the peer's prompt (all text in the prefill) + their audio."""
    from dataclasses import replace

    from qtts import backends
    from qtts.export.verify import generate_codes, greedy_params
    from qtts.options import SamplingParams
    from qtts.text.prompt import Mode, build_prompt

    parts = backends.open(str(args.model), threads=args.threads)
    cfg = parts.config
    speakers = list(cfg.speakers)
    dim = cfg.speaker_encoder.enc_dim if cfg.speaker_encoder is not None else cfg.talker.hidden_size
    spk = np.random.default_rng(XVEC_SEED).standard_normal(dim).astype(np.float32) * XVEC_SCALE
    mode = Mode("custom_voice", speaker=speakers[0]) if speakers else Mode("xvector", xvector=spk)
    prompt = build_prompt(cfg, parts.tokenizer, TEXT, mode, non_streaming_text=True)
    greedy = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    # the peer's greedy path is a plain argmax: no repetition penalty on either stage
    lp = replace(greedy_params(cfg, args.frames), talker=greedy, predictor=greedy)
    codes = generate_codes(parts.backend, prompt, lp, None if speakers else spk)
    stream = parts.vocoder.stream()
    pcm = stream.decode(codes) if len(codes) else np.zeros(0, np.float32)
    np.savez(args.qtts_reference, codes=codes, pcm=np.asarray(pcm, np.float32))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common(ap)
    ap.add_argument("--variant", default="F32", choices=("F32", "Q8_0", "Q4_K_M"))
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--qtts-python", default=str(ROOT / ".venv/bin/python"), help="python with qtts + torch")
    ap.add_argument("--qtts-reference", metavar="OUT_NPZ", help=argparse.SUPPRESS)  # internal: the qtts side
    args = ap.parse_args(argv)
    try:
        if args.model is None:
            raise InputError("--model CKPT is required (the checkpoint the GGUFs came from)")
        if args.qtts_reference:
            return qtts_reference(args)
        return check(args)
    except InputError as exc:
        print(f"peer_check: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
