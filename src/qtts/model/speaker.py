"""ECAPA-TDNN speaker encoder (x-vector) of the Base checkpoints, pure torch.

Module paths equal the checkpoint keys under ``speaker_encoder.``:
``blocks.0.conv``, ``blocks.{1,2,3}.{tdnn1,res2net_block.blocks.N,tdnn2}.conv``,
``blocks.{1,2,3}.se_block.{conv1,conv2}``, ``mfa.conv``, ``asp.tdnn.conv``, ``asp.conv``, ``fc``.

Every conv uses reflect "same" padding (left = d*(k-1)//2, right = the rest), like
``nn.Conv1d(padding="same", padding_mode="reflect")`` in the official model.
Input: log-mel ``[B, frames, 128]`` from :func:`qtts.audio.mel.log_mel` (the runtimes compute it on the
host); output ``[B, enc_dim]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SpeakerEncoderConfig

_STD_EPS = 1e-12  # variance clamp of the attentive statistics pooling


def _conv_same_reflect(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    total = conv.dilation[0] * (conv.kernel_size[0] - 1)
    if total:
        x = F.pad(x, (total // 2, total - total // 2), mode="reflect")
    return conv(x)


class TDNN(nn.Module):
    """Conv1d (reflect same padding) + ReLU; parameters live under ``.conv``."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(_conv_same_reflect(self.conv, x))


class Res2Net(nn.Module):
    """Split channels in ``scale`` chunks; chunk 0 passes, chunk i>=1 -> TDNN(chunk_i + previous output)."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        y = None
        for i in range(1, self.scale):
            y = self.blocks[i - 1](parts[i] if i == 1 else parts[i] + y)
            outs.append(y)
        return torch.cat(outs, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, se_channels, 1)
        self.conv2 = nn.Conv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=2, keepdim=True)  # [B, C, 1]
        s = torch.sigmoid(self.conv2(torch.relu(self.conv1(s))))
        return x * s


class SERes2NetBlock(nn.Module):
    """TDNN k1 -> Res2Net -> TDNN k1 -> squeeze-excitation, plus the block input."""

    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out, 1)
        self.res2net_block = Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNN(c_out, c_out, 1)
        self.se_block = SqueezeExcitation(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tdnn2(self.res2net_block(self.tdnn1(x)))
        return self.se_block(y) + x


def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time; ``w`` sums to 1 along dim 2."""
    mean = (w * x).sum(2)
    var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(2)
    return mean, torch.sqrt(var.clamp(_STD_EPS))


class AttentiveStatsPool(nn.Module):
    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        uniform = torch.ones_like(x[:, :1, :]) / frames  # [B, 1, T]
        mean, std = _stats(x, uniform)
        ctx = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        att = self.conv(torch.tanh(self.tdnn(ctx)))
        att = torch.softmax(att, dim=2)
        mean, std = _stats(x, att)
        return torch.cat([mean, std], dim=1).unsqueeze(2)  # [B, 2C, 1]


class SpeakerEncoder(nn.Module):
    """``forward(mel [B, frames, mel_dim]) -> [B, enc_dim]``."""

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        ch, ks, dil = list(cfg.enc_channels), list(cfg.enc_kernel_sizes), list(cfg.enc_dilations)
        if not len(ch) == len(ks) == len(dil):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have the same length")
        self.config = cfg
        blocks = [TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(
                SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
            )
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = mel.transpose(1, 2)  # [B, mel_dim, T]
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)  # [B, enc_dim]

