"""One-off check of the two encoders at FULL size (real 0.6B-Base configs, random weights).

Builds the official modules with random weights, copies them into ours, then reports parity
(speaker embedding max error relative to max|ref|; codec codes agreement) and fp32 CPU timings
(median of a few runs, ours and official side by side on the same machine).

    .venv/bin/python scripts/encoders_fullsize.py [--seconds 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
REF = os.path.normpath(
    os.path.join(HERE, "..", "..", "shared", "reference", "configs", "Qwen3-TTS-12Hz-0.6B-Base")
)

from qtts.audio.mel import log_mel  # noqa: E402
from qtts.backends.torch import TorchSpeakerEncoder  # noqa: E402
from qtts.config import ModelConfig  # noqa: E402
from qtts.model.speaker import SpeakerEncoder  # noqa: E402
from qtts.model.speech_encoder import Encoder  # noqa: E402
from support import official  # noqa: E402
from support.encoder_helpers import codec_wav, speaker_wav  # noqa: E402


def _randomize(module, seed: int, gain: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(".scale") or "norm" in name:
                continue
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p[0].numel()))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for name, b in module.named_buffers():
            if name.endswith("cluster_usage"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))


def _time(fn, repeats: int) -> dict:
    """Median wall and process-CPU milliseconds (CPU time is less sensitive to a loaded machine)."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {
        "wall_ms": round(1e3 * statistics.median(wall), 1),
        "cpu_ms": round(1e3 * statistics.median(cpu), 1),
    }


def speaker(cfg, seconds: float, repeats: int) -> dict:
    official.qwen_tts()
    from qwen_tts.core.models import modeling_qwen3_tts as m
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig

    with open(os.path.join(REF, "config.json"), encoding="utf-8") as fh:
        spk_cfg = json.load(fh)["speaker_encoder_config"]
    ref = m.Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**spk_cfg)).eval()
    _randomize(ref, 0, 1.0)
    ours = SpeakerEncoder(cfg.speaker_encoder).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    y = speaker_wav(seconds, 0)

    def official_run():
        with torch.inference_mode():
            mels = m.mel_spectrogram(
                torch.from_numpy(y)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                hop_size=256, win_size=1024, fmin=0, fmax=12000,
            ).transpose(1, 2)  # fmt: skip
            return ref(mels)[0].numpy()

    expected, got = official_run(), TorchSpeakerEncoder(ours).embed(y)
    with torch.inference_mode():
        mel_t = torch.from_numpy(log_mel(y))[None]
        t_encoder = _time(lambda: ours(mel_t), repeats)
    return {
        "max_abs_err_rel": float(np.abs(got - expected).max() / np.abs(expected).max()),
        "ours_ms": _time(lambda: TorchSpeakerEncoder(ours).embed(y), repeats),
        "ours_mel_ms": _time(lambda: log_mel(y), repeats),
        "ours_encoder_only_ms": t_encoder,
        "official_ms": _time(official_run, repeats),
    }


def codec(cfg, seconds: float, repeats: int) -> dict:
    official.qwen_tts()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Encoder
    from transformers import MimiConfig

    with open(os.path.join(REF, "speech_tokenizer", "config.json"), encoding="utf-8") as fh:
        enc_cfg = json.load(fh)["encoder_config"]
    ref = Qwen3TTSTokenizerV2Encoder(MimiConfig(**enc_cfg)).eval()
    _randomize(ref, 1, 1.5)
    st = cfg.speech_tokenizer
    ours = Encoder(st.encoder_config, st.encoder_valid_num_quantizers).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.from_numpy(codec_wav(seconds, 0))[None]

    def official_run():
        with torch.inference_mode():
            return ref.encode(x[:, None], return_dict=True).audio_codes[:, :16].transpose(1, 2)

    expected, got = official_run(), ours.encode(x)
    return {
        "frames": int(got.shape[1]),
        "codes_equal_fraction": float((got == expected).float().mean()),
        "distinct_codes_cb0": int(len(torch.unique(got[0, :, 0]))),
        "ours_ms": _time(lambda: ours.encode(x), repeats),
        "official_ms": _time(official_run, repeats),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: CPU time = cost)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ModelConfig.from_dir(REF)
    out = {
        "torch_threads": torch.get_num_threads(),
        "speaker_encoder": speaker(cfg, args.seconds, args.repeats),
        "speech_encoder": codec(cfg, args.seconds, args.repeats),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
