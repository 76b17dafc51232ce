#!/usr/bin/env python3
"""HTTP overhead of the qtts server, as ratios measured side by side in one run.

For the same requests (text, speaker, seed, frame budget) it times ``tts.stream()`` called
directly and ``POST /v1/audio/speech`` (pcm, streamed) against an in-process server on the same
engine, alternating the two so machine load hits both alike. Reports median time to first audio
and median total time, and the server/direct ratios.

    .venv/bin/python benchmarks/server_overhead.py --model DIR [--rounds 10 --frames 24]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="CustomVoice snapshot (default: a tiny random one)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--frames", type=int, default=24)
    args = p.parse_args()

    import httpx

    import qtts
    from qtts.options import SynthesisOptions
    from qtts.server import ServerSettings, create_app
    from qtts.server.runner import ServerThread

    model = args.model
    if model is None:
        from qtts.tools.random_checkpoint import write_random_checkpoint

        tok = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "reference", "configs",
                           "text-tokenizer-qwen2")
        model = write_random_checkpoint(os.path.join(tempfile.mkdtemp(), "cv"), size="tiny", kind="custom_voice",
                                        layout="0.6b", seed=0, tokenizer_dir=tok if os.path.isdir(tok) else None)
    tts = qtts.load(model, threads=1)
    speaker = tts.speakers[0]
    text = "The quick brown fox jumps over the lazy dog."
    direct, served = {"ttfa": [], "total": []}, {"ttfa": [], "total": []}
    with ServerThread(create_app(tts, ServerSettings(max_frames=args.frames, access_log=False))) as srv, \
            httpx.Client(base_url=srv.url, timeout=300) as client:
        for i in range(args.rounds + 1):  # round 0 warms up both paths
            t0 = time.perf_counter()
            first = None
            for _chunk in tts.stream(text, speaker=speaker, options=SynthesisOptions(seed=i, max_frames=args.frames)):
                first = first or time.perf_counter() - t0
            d_total = time.perf_counter() - t0
            t0 = time.perf_counter()
            body = {"input": text, "voice": speaker, "seed": i, "max_frames": args.frames, "response_format": "pcm"}
            with client.stream("POST", "/v1/audio/speech", json=body) as r:
                it = r.iter_raw()
                next(it)
                s_first = time.perf_counter() - t0
                size = sum(len(b) for b in it)
            s_total = time.perf_counter() - t0
            assert r.status_code == 200 and size > 0
            if i:
                direct["ttfa"].append(first)
                direct["total"].append(d_total)
                served["ttfa"].append(s_first)
                served["total"].append(s_total)
    for key in ("ttfa", "total"):
        d, s = statistics.median(direct[key]), statistics.median(served[key])
        print(f"{key:5s}: direct {1000 * d:8.1f} ms   server {1000 * s:8.1f} ms   server/direct {s / d:.3f}")
    print(f"({args.rounds} rounds, {args.frames} frames each, 1 engine, pcm over loopback)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
