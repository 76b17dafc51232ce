"""``qtts verify vocoder``: stateful stepwise decode vs the offline decode, SNR per schedule."""

from __future__ import annotations

import time

COMMAND = ("verify", "vocoder")
HELP = "check the streaming vocoder step against the offline decode (SNR in dB per chunk schedule)"

DEFAULT_SCHEDULES = ("1", "2", "4", "16", "64", "2,16")


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="snapshot directory or hub id")
    parser.add_argument(
        "--chunks", action="append", metavar="B[,B...]",
        help="a step schedule: sizes of the first steps, the last one repeats, then a remainder step "
        "(e.g. 2,16 = 2 then 16s); repeatable (default: " + " ".join(DEFAULT_SCHEDULES) + ")",
    )  # fmt: skip
    parser.add_argument("--frames", type=int, default=300, help="random frames to decode (default 300)")
    parser.add_argument("--gate", type=float, default=100.0, help="minimum SNR in dB (default 100, fp32)")
    parser.add_argument("--seed", type=int, default=0, help="random codes seed")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")


def expand_schedule(spec: str, frames: int) -> list[int]:
    """'2,16' over 37 frames -> [2, 16, 16, 3]."""
    from ..errors import InputError

    try:
        sizes = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError as exc:
        raise InputError(f"--chunks '{spec}': expected comma-separated integers") from exc
    if not sizes or min(sizes) < 1:
        raise InputError(f"--chunks '{spec}': step sizes must be >= 1")
    out: list[int] = []
    while sum(out) < frames:
        out.append(min(sizes[min(len(out), len(sizes) - 1)], frames - sum(out)))
    return out


def run(args) -> int:
    import numpy as np
    import torch

    from ..audio import snr_db
    from ..backends.torch import step_decode
    from ..errors import InputError
    from ..export.vocoder import load_decoder
    from ..model.vocoder_step import VocoderStep

    if args.frames < 1:
        raise InputError("--frames must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    schedules = args.chunks or list(DEFAULT_SCHEDULES)
    plans = {s: expand_schedule(s, args.frames) for s in schedules}
    decoder = load_decoder(args.model)
    codes = np.random.default_rng(args.seed).integers(0, decoder.config.codebook_size, (args.frames, 16))
    codes = torch.from_numpy(codes.T[None].copy())
    t0 = time.perf_counter()
    with torch.inference_mode():
        ref = decoder(codes).reshape(-1).numpy()
    t_full = time.perf_counter() - t0
    print(
        f"offline decode: {args.frames} frames in {t_full:.2f} s ({1000 * t_full / args.frames:.1f} ms/frame)"
    )
    steps: dict[int, VocoderStep] = {}

    def step_for(b: int) -> VocoderStep:
        if b not in steps:
            steps[b] = VocoderStep(decoder, b, like=next(iter(steps.values()), None)).eval()
        return steps[b]

    worst = float("inf")
    for spec, plan in plans.items():
        t0 = time.perf_counter()
        out = step_decode(step_for, codes, plan)
        dt = time.perf_counter() - t0
        snr = snr_db(ref, out) if len(out) == len(ref) else float("-inf")
        worst = min(worst, snr)
        verdict = "ok" if snr >= args.gate else "FAIL"
        print(
            f"schedule {spec:>8}: {len(plan)} steps, SNR {snr:7.1f} dB, "
            f"{1000 * dt / args.frames:.1f} ms/frame  {verdict}"
        )
    print(f"worst SNR {worst:.1f} dB (gate {args.gate:g} dB, window {decoder.config.sliding_window} frames)")
    return 0 if worst >= args.gate else 1
