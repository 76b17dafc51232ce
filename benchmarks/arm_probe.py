"""Where greedy codes from the same bundle part between two CPUs: the talker and predictor graphs on
fixed random inputs, saved on each side, compared afterwards (benchmarks/arm.sh runs it on x86-64 and
the emulated arm64).

    python benchmarks/arm_probe.py run OUT.npz --model CKPT --bundle fp32=B32 --bundle int8=B8
    python benchmarks/arm_probe.py compare X86.npz ARM.npz

Per bundle: the talker's logits and hidden state for a 16-row prefill plus 8 single steps, and the
fused predictor frame graph (greedy) for 64 random (hidden, code0) pairs: its 15 codes and the
logits it picked them from. ``compare`` prints the SNR of each output between the sides, the share
of predictor codes that agree, and for the first disagreement of each frame the top-2 margin of
the x86 logits at that step next to the size of the cross-CPU logit difference there: a greedy pick
flips only where the two best logits are closer than the arithmetic of the two CPUs differs.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import numpy as np

PREFILL, STEPS, FRAMES, SEED = 16, 8, 64, 3


def _probe(model: str, bundle: str) -> dict:
    import qtts.backends as backends

    comp = backends.open(model, plan=os.path.join(bundle, "plan.json"), parts=("generation",), threads=1)
    be, rng = comp.backend, np.random.default_rng(SEED)
    width = comp.config.talker.hidden_size
    embeds = (rng.standard_normal((PREFILL + STEPS, width)) * 0.5).astype(np.float32)
    state = be.new_state(PREFILL + STEPS)
    logits, hidden, state = be.talker(embeds[:PREFILL], 0, state)
    t_logits, t_hidden = [logits[-1]], [hidden[-1]]
    for i in range(STEPS):
        logits, hidden, state = be.talker(embeds[PREFILL + i : PREFILL + i + 1], PREFILL + i, state)
        t_logits.append(logits[-1])
        t_hidden.append(hidden[-1])
    greedy = SimpleNamespace(params=SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0, do_sample=False))
    codes, p_logits = [], []
    vocab = comp.config.talker.vocab_size
    for _ in range(FRAMES):
        h = (rng.standard_normal(width) * 2.0).astype(np.float32)
        c, lg = be.predictor_logits(h, int(rng.integers(0, min(vocab, 2048))), greedy, np.zeros(15, np.float32))
        codes.append(c.reshape(-1))
        p_logits.append(lg.reshape(15, -1))
    return {"talker_logits": np.stack(t_logits), "talker_hidden": np.stack(t_hidden),
            "predictor_codes": np.stack(codes), "predictor_logits": np.stack(p_logits)}


def run(out: str, model: str, bundles: list[str]) -> int:
    saved = {}
    for prec, bundle in (b.split("=", 1) for b in bundles):
        for key, value in _probe(model, bundle).items():
            saved[f"{prec}/{key}"] = value
    np.savez(out, **saved)
    print(f"wrote {out}: {', '.join(sorted(saved))}")
    return 0


def _snr(ref: np.ndarray, got: np.ndarray) -> str:
    err = float(((ref.astype(np.float64) - got) ** 2).sum())
    return "identical" if err == 0 else f"{10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / err):.1f} dB"


def compare(x86_path: str, arm_path: str) -> list[str]:
    x86, arm = np.load(x86_path), np.load(arm_path)
    lines = []
    for prec in sorted({k.split("/")[0] for k in x86.files}):

        def get(side, k: str, prec: str = prec) -> np.ndarray:
            return side[f"{prec}/{k}"]

        xc, ac = get(x86, "predictor_codes"), get(arm, "predictor_codes")
        xl, al = get(x86, "predictor_logits"), get(arm, "predictor_logits")
        agree = int((xc == ac).sum())
        flips = []
        for f in range(len(xc)):
            bad = np.nonzero(xc[f] != ac[f])[0]
            if len(bad):  # the first disagreeing step of this frame: same inputs up to there
                s = int(bad[0])
                top2 = np.sort(xl[f, s])[-2:]
                flips.append((float(top2[1] - top2[0]), float(np.abs(xl[f, s] - al[f, s]).max())))
        same_input = np.array([xc[f, 0] == ac[f, 0] for f in range(len(xc))])
        lines.append(
            f"{prec}: talker logits {_snr(get(x86, 'talker_logits'), get(arm, 'talker_logits'))}, "
            f"hidden {_snr(get(x86, 'talker_hidden'), get(arm, 'talker_hidden'))}; predictor head-0 logits "
            f"{_snr(xl[:, 0], al[:, 0])}, greedy codes {agree}/{xc.size} agree"
            + (f" ({sum(same_input)}/{len(xc)} frames agree at codebook 1)" if len(flips) else ""))
        for margin, diff in flips[:5]:
            lines.append(f"    a flip: top-2 margin {margin:.2e} of the x86 logits, |x86 - arm64| up to {diff:.2e} there")
    return lines


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--model", required=True)
    r.add_argument("--bundle", action="append", required=True)
    c = sub.add_parser("compare")
    c.add_argument("x86")
    c.add_argument("arm")
    a = p.parse_args()
    if a.what == "run":
        sys.exit(run(a.out, a.model, a.bundle))
    print("\n".join(compare(a.x86, a.arm)))
