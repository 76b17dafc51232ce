"""How much a checkpoint's talker amplifies weight errors, with no quantizer involved.

Usage (PYTHONPATH=src, or an installed qtts)::

    python benchmarks/sensitivity.py -m MODEL [-m MODEL2 ...] [--snr 19.5 --snr 43] [--positions 32]

Every projection of the talker graph (q/k/v, o, gate/up, down, the codec head) gets i.i.d. Gaussian
noise at a fixed weight SNR (19.5 dB is what block-128 4-bit absmax reaches on Gaussian weights, ~43 dB
8-bit), measured against the weight the quantizer would see: the graph of ``--repair rotate`` (norm gains
folded in, rotated), so a planted outlier gain counts as weight energy, as it does for the quantizer.
The talker then runs ``--positions`` random input rows at once (fp32, torch) and the script prints the
codec-logit SNR against the noiseless run, min / median over positions, per checkpoint and level.

Two checkpoints whose weights get the same relative error but whose logits differ by D dB differ by D
dB in how much their layers amplify errors: no weight quantizer of the same bits can close that gap.
Random weights test the method, not the real model.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


def _talker_graph(model: str):
    from qtts.export.graphs import TalkerGraph
    from qtts.weights import load_checkpoint

    talker = load_checkpoint(model, components=("talker",)).model.talker.eval()
    return TalkerGraph(talker, rotate=True).eval(), talker.cfg


def _noisy(weight: torch.Tensor, snr_db: float, gen: torch.Generator) -> torch.Tensor:
    sigma = float(weight.pow(2).mean().sqrt()) * 10 ** (-snr_db / 20)
    return weight + sigma * torch.randn(weight.shape, generator=gen)


def _run(graph, cfg, embeds: torch.Tensor):
    from qtts.export.contrib import rope_tables
    from qtts.export.graphs import run_layers

    t = embeds.shape[1]
    cos, sin = rope_tables(t, cfg.head_dim, cfg.rope_theta)
    past = [torch.zeros(1, cfg.num_key_value_heads, t, cfg.head_dim) for _ in range(2 * cfg.num_hidden_layers)]
    x = graph.rotation(embeds)
    h, _ = run_layers(graph.layers, x, past, torch.tensor([t - 1], dtype=torch.int32),
                       torch.tensor(t, dtype=torch.int32), cos, sin, graph.norm)  # fmt: skip
    return torch.matmul(h, graph.head)[0]  # [T, vocab]


def measure(model: str, levels: list, positions: int, seed: int) -> list:
    graph, cfg = _talker_graph(model)
    rng = np.random.default_rng(seed)
    embeds = torch.from_numpy(rng.standard_normal((1, positions, cfg.hidden_size)).astype(np.float32) * 0.05)
    names = [n for n, p in graph.named_parameters() if p.dim() == 2]
    clean = {n: p.detach().clone() for n, p in graph.named_parameters() if n in names}
    rows = []
    with torch.no_grad():
        ref = _run(graph, cfg, embeds)
        for snr in levels:
            gen = torch.Generator().manual_seed(seed)
            for n, p in graph.named_parameters():
                if n in names:
                    p.copy_(_noisy(clean[n], snr, gen))
            out = _run(graph, cfg, embeds)
            per = 10 * torch.log10(ref.pow(2).sum(-1) / (ref - out).pow(2).sum(-1))
            rows.append((model, snr, float(per.min()), float(per.median())))
            for n, p in graph.named_parameters():
                if n in names:
                    p.copy_(clean[n])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", required=True, help="checkpoint folder (repeatable)")
    ap.add_argument("--snr", action="append", type=float, help="weight SNR dB (repeatable; default 19.5, 43)")
    ap.add_argument("--positions", type=int, default=32, help="input rows per run (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    print("| checkpoint | weight SNR dB | talker-logit SNR dB min / median |\n|---|---|---|")
    for model in opts.model:
        for name, snr, lo, med in measure(model, opts.snr or [19.5, 43.0], opts.positions, opts.seed):
            print(f"| {name} | {snr:.1f} | {lo:.1f} / {med:.1f} |", flush=True)
    print("\nRandom weights test the method, not the real model.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
