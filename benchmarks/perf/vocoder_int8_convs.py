#!/usr/bin/env python3
"""Would int8 residual convolutions make the vocoder cheaper at the bf16 bar? Emulated fidelity and
the convolutions' CPU, both on one checkpoint's decoder.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/vocoder_int8_convs.py --model DIR [--frames 320]
        [--blocks 234 1234 ...] [--skip-fidelity] [--skip-speed]

Fidelity (emulated, fp32 arithmetic, offline decode of ``--frames`` random frames, seed 0, as
``qtts verify plan``'s bar): each chosen convolution's weights rounded to int8 per output channel
(symmetric) and its input rounded to uint8 per 8-frame block (asymmetric, the scale a streaming
step of 8 frames would compute at run time); "rest bf16" also rounds the weights and inputs of every
other layer the product's bf16 step runs in bf16 (all but the depthwise convolutions, pre_conv and
the RVQ projections; sums stay fp32, so a little kinder than the step). Printed beside
the bar (the decoder cast to bf16): waveform SNR, worst 170 ms segment, log-spectral distance
(docs/fidelity.md). ``--blocks`` adds a row per value: the k7 convolutions of those decoder blocks
only (digits 1-4, the 768-, 384-, 192- and 96-channel blocks) in int8, the rest bf16. Random
weights test the mechanism, not the real model's reaction to int8.

Speed: the twelve dilated kernel-7 convolutions of an 8-frame step (rows layout, one thread), as
the product's packed bf16 oneDNN convolution and as oneDNN's int8 convolution
(``torch.ops.onednn.qconv2d_pointwise``, prepacked weights, fp32 out), with and without quantizing
the input (torch ops), per block width and in all. Name the CPU beside any figure.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import time

import numpy as np
import torch

from qtts.export.audio_metrics import audio_distances
from qtts.export.vocoder import load_decoder
from qtts.export.vocoder_bar import offline_decode, random_codes

K7 = r"decoder\.\d\.block\.[234]\.conv1\.conv"  # the dilated kernel-7 convolutions (~3.5 of 4.8 GFLOP)
K1 = r"decoder\.\d\.block\.[234]\.conv2\.conv"
KEEP_FP32 = r"upsample\.\d\.1\.dwconv\.conv"  # the depthwise convolutions: fp32 in the product's bf16 step
LAYERS = (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)


def fake_uint8(x: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.empty_like(x)
    for s in range(0, x.shape[-1], block):
        v = x[..., s : s + block]
        lo, hi = v.min().clamp(max=0), v.max().clamp(min=0)
        scale = ((hi - lo) / 255).clamp_min(1e-12)
        zp = torch.round(-lo / scale)
        out[..., s : s + block] = (torch.round(v / scale + zp).clamp(0, 255) - zp) * scale
    return out


def fake_int8_weight(w: torch.Tensor) -> torch.Tensor:
    scale = w.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-12) / 127
    return torch.round(w / scale).clamp(-127, 127) * scale


def variant(decoder, codes, pattern: str, weights=True, acts=True, rest_bf16=False) -> np.ndarray:
    d = copy.deepcopy(decoder)
    frames = len(codes)
    for name, m in d.named_modules():
        if not isinstance(m, LAYERS) or not name.startswith(("decoder.", "upsample.", "pre_transformer.")):
            continue
        if re.fullmatch(pattern, name):
            if weights:
                with torch.no_grad():
                    m.weight.copy_(fake_int8_weight(m.weight))
            if acts:
                m.register_forward_pre_hook(
                    lambda mod, a: (fake_uint8(a[0], a[0].shape[-1] * 8 // frames),) + a[1:]
                )
        elif rest_bf16 and not re.fullmatch(KEEP_FP32, name):
            with torch.no_grad():
                m.weight.copy_(m.weight.to(torch.bfloat16).float())
            m.register_forward_pre_hook(lambda mod, a: (a[0].to(torch.bfloat16).float(),) + a[1:])
    return offline_decode(d, codes)


def k7_in(blocks: str) -> str:
    """The k7 convolutions of the decoder blocks named by ``blocks`` (digits 1-4)."""
    if not blocks or not set(blocks) <= set("1234"):
        raise SystemExit(f"--blocks {blocks!r}: name decoder blocks by the digits 1-4, e.g. 234")
    return rf"decoder\.[{blocks}]\.block\.[234]\.conv1\.conv"


def fidelity(decoder, frames: int, blocks: list[str]) -> None:
    codes = random_codes(frames, 16, 2048)
    ref = offline_decode(decoder, codes)
    rows = [("bar: the decoder in bf16", lambda: offline_decode(decoder, codes, torch.bfloat16)),
            ("rest bf16, no int8", lambda: variant(decoder, codes, "none", rest_bf16=True)),
            ("k7 int8 weights only", lambda: variant(decoder, codes, K7, acts=False)),
            ("k7 int8 inputs only", lambda: variant(decoder, codes, K7, weights=False)),
            ("k7 int8", lambda: variant(decoder, codes, K7)),
            ("k7 int8 + rest bf16", lambda: variant(decoder, codes, K7, rest_bf16=True)),
            ("k7 and k1 int8", lambda: variant(decoder, codes, f"{K7}|{K1}"))]  # fmt: skip
    rows += [(f"k7 int8 in blocks {b} + rest bf16", lambda b=b: variant(decoder, codes, k7_in(b), rest_bf16=True))
             for b in blocks]  # fmt: skip
    print(f"fidelity against the fp32 offline decode, {frames} frames (random weights):")
    for label, fn in rows:
        m = audio_distances(ref, fn())
        print(f"  {label:<28} SNR {m['snr_db']:6.2f} dB  worst 170 ms {m['worst_segment_snr_db']:6.2f} dB  "
              f"LSD {m['lsd_db']:.3f}", flush=True)  # fmt: skip


def _ms(fn, n: int = 40) -> float:
    for _ in range(3):
        fn()
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return 1000.0 * (time.process_time() - t0) / n


def conv_pair(c: int, t: int, d: int) -> dict:
    """CPU ms of one k7 convolution over ``t`` rows of ``c`` channels, dilation ``d``: bf16 vs int8."""
    rows = torch.randn(t + 6 * d, c).to(torch.bfloat16)
    w, bias = torch.randn(c, c, 7) * 0.02, torch.zeros(c)
    packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
        w.to(torch.bfloat16).unsqueeze(2).to_mkldnn(), [0, 0], [1, 1], [1, d], 1, [1, c, 1, rows.shape[0]]
    )
    wscale = w.abs().amax((1, 2)) / 127
    qw = torch.round(w / wscale[:, None, None]).clamp(-127, 127).to(torch.int8)
    qpacked = torch.ops.onednn.qconv_prepack(qw.unsqueeze(2), wscale, 0.05, 128, [1, 1], [0, 0], [1, d], 1,
                                             [1, c, 1, rows.shape[0]])  # fmt: skip
    zeros = torch.zeros(c, dtype=torch.long)
    bf16_bias = bias.to(torch.bfloat16)

    def bf16():
        return torch.ops.mkldnn._convolution_pointwise(rows.t()[None, :, None, :], packed, bf16_bias, [0, 0],
                                                       [1, 1], [1, d], 1, "none", [], "")  # fmt: skip

    def int8(q, scale=0.05, zp=128):
        return torch.ops.onednn.qconv2d_pointwise(
            q.t()[None, :, None, :],
            scale,
            zp,
            qpacked,
            wscale,
            zeros,
            bias,
            [1, 1],
            [0, 0],
            [1, d],
            1,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )

    fixed = torch.randint(0, 255, rows.shape, dtype=torch.uint8)

    def int8_quantizing():
        lo, hi = (float(v) for v in torch.aminmax(rows))
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max((hi - lo) / 255, 1e-12)
        zp = int(round(-lo / scale))
        return int8(
            torch.clamp(torch.round(rows.float() * (1 / scale)) + zp, 0, 255).to(torch.uint8), scale, zp
        )

    return {"bf16": _ms(bf16), "int8": _ms(lambda: int8(fixed)), "int8 + quantize": _ms(int8_quantizing)}


def speed() -> None:
    torch.set_num_threads(1)
    total: dict = {}
    print("the twelve k7 convolutions of an 8-frame step, CPU ms per 80 ms frame (one thread):")
    for block, (c, per_frame) in enumerate(((768, 32), (384, 160), (192, 640), (96, 1920)), start=1):
        row: dict = {}
        for d in (1, 3, 9):
            for k, v in conv_pair(c, 8 * per_frame, d).items():
                row[k] = row.get(k, 0.0) + v / 8
                total[k] = total.get(k, 0.0) + v / 8
        print(
            f"  block {block} ({c} channels): " + "  ".join(f"{k} {v:.2f} ms" for k, v in row.items()),
            flush=True,
        )
    for k, v in total.items():
        print(f"  {k:<16} {v:6.2f} ms  x{v / total['bf16']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--frames", type=int, default=320)
    ap.add_argument(
        "--blocks", nargs="*", default=[], help="a row per value: k7 int8 in these decoder blocks only"
    )
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    for b in args.blocks:
        k7_in(b)
    print(f"loadavg {os.getloadavg()[0]:.2f}")
    if not args.skip_speed:
        speed()
    if not args.skip_fidelity:
        torch.set_num_threads(2)
        fidelity(load_decoder(args.model), args.frames, args.blocks)


if __name__ == "__main__":
    main()
