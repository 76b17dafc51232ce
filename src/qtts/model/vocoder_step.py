"""Fixed-shape, stateful streaming step of the speech-tokenizer decoder.

``VocoderStep(decoder, B)`` decodes ``B`` frames per call from a flat fp32 state vector:

    inputs   audio_codes [1, 16, B] int64   the next B frames
             freqs_in    [B, head_dim/2] fp32  (pos * inv_freq) mod 2*pi, from the host
             cache_valid [1] fp32          number of real KV history slots = min(pos, window-1)
             cache_in    [N] fp32          the state after the previous step (zeros at the start)
    outputs  audio_values [B*1920] fp32, cache_out [N] fp32

The state holds, for every causal (transposed) convolution, the last ``context`` input frames
it needs, and per transformer layer the keys/values of the last ``window-1`` positions. What
is where is described by :class:`CacheLayout` (computed from the config only), so ``N`` does not
depend on ``B``: a small-B step's cache feeds a large-B step. Consecutive steps reproduce the
offline :class:`~qtts.model.vocoder.Decoder` to fp32 rounding (no seams).

Graph choices, each measured on the Rockchip NPU (see docs/vocoder.md):

* KV history and the step's keys/values are joined by constant selection matmuls, not Concat.
* The sliding-window mask is a constant on the *relative* grid at -100 (not -3e4 / -inf).
* Never-written history slots get a -100 bias computed from the host-supplied ``cache_valid``.
* RoPE angles come in reduced mod 2*pi (fp16 cannot hold pos*inv_freq at pos ~1e3).
* SnakeBeta's exp(alpha), 1/(exp(beta)+eps) are folded to constants (no Exp), sin*sin (no Pow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig
from .layers import rope_inv_freq
from .vocoder import RESIDUAL_DILATIONS, Decoder, SnakeBeta, attend, snake

MASK_VALUE = -100.0  # exp(-100) == 0 in fp16; -3e4 leaks through the NPU softmax


@dataclass(frozen=True)
class CacheEntry:
    """One slice of the flat state: ``name`` is the module path of its owner."""

    name: str
    offset: int
    size: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CacheLayout:
    entries: tuple[CacheEntry, ...]
    kv_slots: int  # window - 1: history positions kept per layer

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def __getitem__(self, name: str) -> CacheEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {e.name: flat[e.offset : e.offset + e.size].reshape(e.shape) for e in self.entries}

    @classmethod
    def from_config(cls, cfg: DecoderConfig) -> CacheLayout:
        """Entries in graph order; conv entries are [channels, context] input histories."""
        kv = cfg.sliding_window - 1
        kv_shape = (cfg.num_key_value_heads, kv, cfg.head_dim)
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        specs: list[tuple[str, tuple[int, ...]]] = [("pre_conv", (cfg.codebook_dim, 2))]
        for i in range(cfg.num_hidden_layers):
            specs += [
                (f"pre_transformer.layers.{i}.k", kv_shape),
                (f"pre_transformer.layers.{i}.v", kv_shape),
            ]
        for i, r in enumerate(cfg.upsampling_ratios):
            specs += [(f"upsample.{i}.0", (cfg.latent_dim, (r - 1) // r))]
            specs += [(f"upsample.{i}.1.dwconv", (cfg.latent_dim, 6))]
        specs.append(("decoder.0", (cfg.latent_dim, 6)))
        for b, r in enumerate(cfg.upsample_rates):
            specs.append((f"decoder.{b + 1}.block.1", (dims[b], (2 * r - 1) // r)))
            for j, d in enumerate(RESIDUAL_DILATIONS):
                specs.append((f"decoder.{b + 1}.block.{j + 2}.conv1", (dims[b + 1], 6 * d)))
        specs.append((f"decoder.{len(cfg.upsample_rates) + 2}", (dims[-1], 6)))
        entries, off = [], 0
        for name, shape in specs:
            n = math.prod(shape)
            if n:  # k == stride transposed convs keep no history
                entries.append(CacheEntry(name, off, n, tuple(shape)))
                off += n
        return cls(tuple(entries), kv)


class _FoldedSnake(nn.Module):
    def __init__(self, act: SnakeBeta):
        super().__init__()
        a, inv_b = act.coefficients()
        self.register_buffer("a", a.detach().clone())
        self.register_buffer("inv_b", inv_b.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.a, self.inv_b)


def _selection(kv: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[kv+b, kv] and [kv+b, b] 0/1 matrices: rows = history slots then the step's positions."""
    hist = torch.zeros(kv + b, kv)
    hist[:kv] = torch.eye(kv)
    cur = torch.zeros(kv + b, b)
    cur[kv:] = torch.eye(b)
    return hist, cur


class VocoderStep(nn.Module):
    """Stateful B-frame step over a :class:`Decoder` (shares its weights)."""

    def __init__(self, decoder: Decoder, codes_length: int, like: VocoderStep | None = None):
        """``like``: another step over the same decoder whose folded constants (codebook tables,
        32 MB at full size, and Snake coefficients) this one shares instead of copying."""
        super().__init__()
        if codes_length < 1:
            raise ValueError("codes_length must be >= 1")
        cfg = decoder.config
        self.decoder = decoder
        self.codes_length = b = int(codes_length)
        self.layout = CacheLayout.from_config(cfg)
        self.samples_per_frame = decoder.samples_per_frame
        kv = self.layout.kv_slots
        self._check_layout()
        hist, cur = _selection(kv, b)
        self.register_buffer("kv_sel_hist", hist, persistent=False)
        self.register_buffer("kv_sel_cur", cur, persistent=False)
        self.register_buffer("slot_bias_proj", hist.t().contiguous(), persistent=False)
        qp = torch.arange(b, dtype=torch.float32)[:, None]
        kp = torch.arange(kv + b, dtype=torch.float32)[None, :] - kv  # key position relative to step start
        visible = (kp <= qp) & (kp > qp - kv - 1)
        mask = torch.where(visible, torch.zeros(()), torch.full((), MASK_VALUE))
        self.register_buffer("attn_mask", mask.view(1, 1, b, kv + b), persistent=False)
        self.register_buffer("slot_idx", torch.arange(kv, dtype=torch.float32).view(1, kv), persistent=False)
        if like is not None and like.decoder is not decoder:
            raise ValueError("like= must be a step over the same decoder")
        books = [*decoder.quantizer.rvq_first.vq.layers, *decoder.quantizer.rvq_rest.vq.layers]
        for i, vq in enumerate(books):  # codebook tables folded to constants (no Clip/Div in the graph)
            table = (
                getattr(like, f"codebook_{i}") if like is not None else vq._codebook.table().detach().clone()
            )
            self.register_buffer(f"codebook_{i}", table, persistent=False)
        self.n_first = decoder.quantizer.n_first
        names = [n for n, m in decoder.named_modules() if isinstance(m, SnakeBeta)]
        self._snake_index = {n: i for i, n in enumerate(names)}
        if like is not None:
            self.snakes = like.snakes
        else:
            self.snakes = nn.ModuleList(_FoldedSnake(decoder.get_submodule(n)) for n in names)

    def _check_layout(self) -> None:
        for e in self.layout.entries:
            mod = self.decoder.get_submodule(
                e.name.rsplit(".", 1)[0] if e.name.endswith((".k", ".v")) else e.name
            )
            if hasattr(mod, "context") and mod.context != e.shape[-1]:
                raise AssertionError(f"cache layout {e.name}: context {e.shape[-1]} != module {mod.context}")

    @property
    def cache_size(self) -> int:
        return self.layout.size

    def init_cache(self) -> torch.Tensor:
        return torch.zeros(self.layout.size, dtype=torch.float32)

    def inv_freq(self) -> np.ndarray:
        """fp32 RoPE inverse frequencies; the host turns them into ``freqs_in`` for each step
        (``qtts.backends.vocoder_step.rope_freqs``: positions reduced mod 2*pi)."""
        cfg = self.decoder.config
        return rope_inv_freq(cfg.head_dim, cfg.rope_theta).numpy()

    def cache_valid(self, pos: int) -> torch.Tensor:
        return torch.tensor([float(min(pos, self.layout.kv_slots))], dtype=torch.float32)

    # ------------------------------------------------------------------ pieces
    def _snake(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.snakes[self._snake_index[name]](x)

    def _conv(self, name: str, x: torch.Tensor, c: dict, out: dict) -> torch.Tensor:
        """Causal conv over [history, x]; the new history is the last ``context`` input frames."""
        conv = self.decoder.get_submodule(name).conv
        xin = torch.cat([c[name][None], x], dim=-1)
        out[name] = xin[0, :, -c[name].shape[-1] :]
        return conv(xin)

    def _convt(self, name: str, x: torch.Tensor, c: dict, out: dict) -> torch.Tensor:
        """Causal transposed conv: recompute over [history, x], keep the outputs of x."""
        mod = self.decoder.get_submodule(name)
        if name not in c:
            return mod(x)
        n = c[name].shape[-1]
        xin = torch.cat([c[name][None], x], dim=-1)
        out[name] = xin[0, :, -n:]
        y = mod.conv(xin)  # (n+L-1)*s + k samples; keep those of x: [n*s, (n+L)*s)
        return y[..., n * mod.stride : -mod.trim] if mod.trim else y[..., n * mod.stride :]

    def _quantize(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [1, 16, B] -> [1, codebook_dim, B], summed in the same order as the offline decode."""
        q = self.decoder.quantizer
        groups = ((q.rvq_first, range(self.n_first)), (q.rvq_rest, range(self.n_first, codes.shape[1])))
        out = 0
        for rvq, ks in groups:
            total = 0
            for k in ks:
                total = total + F.embedding(codes[:, k], getattr(self, f"codebook_{k}")).transpose(1, 2)
            out = out + rvq.output_proj(total)
        return out

    def _slot_bias(self, cache_valid: torch.Tensor) -> torch.Tensor:
        # -100 on the kv_slots - n_valid never-written slots (the real ones are always the last),
        # elementwise on a tiny grid, then spread over [history, current] by a matmul.
        phantom = torch.clamp(self.layout.kv_slots - cache_valid - self.slot_idx, 0.0, 1.0)
        return torch.matmul(MASK_VALUE * phantom, self.slot_bias_proj).view(1, 1, 1, -1)

    def pre_transformer(self) -> nn.Module:
        """The pre-transformer the step runs (a subclass may run a copy in another precision)."""
        return self.decoder.pre_transformer

    def _transformer(self, x, freqs, cache_valid, c: dict, out: dict) -> torch.Tensor:
        t = self.pre_transformer()
        kv = self.layout.kv_slots
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        bias = self.attn_mask + self._slot_bias(cache_valid)
        h = t.input_proj(x)
        for i, layer in enumerate(t.layers):
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(h), cos, sin, shape=(1, self.codes_length))
            kname, vname = f"pre_transformer.layers.{i}.k", f"pre_transformer.layers.{i}.v"
            k_all = torch.matmul(self.kv_sel_hist, c[kname]) + torch.matmul(self.kv_sel_cur, k[0])
            v_all = torch.matmul(self.kv_sel_hist, c[vname]) + torch.matmul(self.kv_sel_cur, v[0])
            out[kname] = k_all[:, -kv:]
            out[vname] = v_all[:, -kv:]
            h = layer.finish(h, attend(q, k_all[None], v_all[None], bias))
        return t.output_proj(t.norm(h))

    # ------------------------------------------------------------------ forward
    def forward(self, audio_codes, freqs_in, cache_valid, cache_in):
        c, out = self.layout.split(cache_in), {}
        h = self._decode(self._quantize(audio_codes), freqs_in, cache_valid, c, out)
        wav = h.clamp(min=-1.0, max=1.0).reshape(-1)
        return wav, torch.cat([out[e.name].reshape(-1) for e in self.layout.entries])

    def _decode(self, latent, freqs_in, cache_valid, c: dict, out: dict) -> torch.Tensor:
        dec = self.decoder
        h = self._conv("pre_conv", latent, c, out)  # [streams, latent, B]
        h = self._transformer(h.transpose(1, 2), freqs_in, cache_valid, c, out).transpose(1, 2)
        for i, (_, block) in enumerate(dec.upsample):
            h = self._convt(f"upsample.{i}.0", h, c, out)
            h = h + block.mix(self._conv(f"upsample.{i}.1.dwconv", h, c, out))
        h = self._conv("decoder.0", h, c, out)
        for b in range(1, len(dec.decoder) - 2):
            h = self._convt(f"decoder.{b}.block.1", self._snake(f"decoder.{b}.block.0", h), c, out)
            for j in range(2, 2 + len(RESIDUAL_DILATIONS)):
                unit = f"decoder.{b}.block.{j}"
                y = self._conv(unit + ".conv1", self._snake(unit + ".act1", h), c, out)
                h = h + dec.get_submodule(unit).conv2.conv(self._snake(unit + ".act2", y))
        last = len(dec.decoder) - 1
        return self._conv(f"decoder.{last}", self._snake(f"decoder.{last - 1}", h), c, out)


class StackedVocoderStep(VocoderStep):
    """Several streams' B-frame steps in one call, each stream at its own position and state:

    inputs   audio_codes [S, 1, 16, B] int64, freqs_in [S, B, head_dim/2], cache_valid [S, 1],
             cache_in [S, N]   (S = any number of streams: a dynamic axis)
    outputs  audio_values [S, B*1920], cache_out [S, N]

    The per-stream math is :class:`VocoderStep`'s; only the leading stream axis is new (the
    single-stream step, whose graph is tuned for NPUs, is left as it is).
    """

    def _split(self, flat: torch.Tensor) -> dict:
        n = flat.shape[0]
        return {e.name: flat[:, e.offset : e.offset + e.size].reshape(n, *e.shape) for e in self.layout.entries}

    def _conv(self, name: str, x: torch.Tensor, c: dict, out: dict) -> torch.Tensor:
        conv = self.decoder.get_submodule(name).conv
        xin = torch.cat([c[name], x], dim=-1)
        out[name] = xin[:, :, -c[name].shape[-1] :]
        return conv(xin)

    def _convt(self, name: str, x: torch.Tensor, c: dict, out: dict) -> torch.Tensor:
        mod = self.decoder.get_submodule(name)
        if name not in c:
            return mod(x)
        n = c[name].shape[-1]
        xin = torch.cat([c[name], x], dim=-1)
        out[name] = xin[:, :, -n:]
        y = mod.conv(xin)
        return y[..., n * mod.stride : -mod.trim] if mod.trim else y[..., n * mod.stride :]

    def _transformer(self, x, freqs, cache_valid, c: dict, out: dict) -> torch.Tensor:
        t = self.decoder.pre_transformer
        kv = self.layout.kv_slots
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [S, 1, B, head_dim]: per-stream positions
        cos, sin = emb.cos(), emb.sin()
        phantom = torch.clamp(kv - cache_valid - self.slot_idx, 0.0, 1.0)  # [S, kv]
        bias = self.attn_mask + torch.matmul(MASK_VALUE * phantom, self.slot_bias_proj)[:, None, None, :]
        h = t.input_proj(x)
        for i, layer in enumerate(t.layers):
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(h), cos, sin)
            kname, vname = f"pre_transformer.layers.{i}.k", f"pre_transformer.layers.{i}.v"
            k_all = torch.matmul(self.kv_sel_hist, c[kname]) + torch.matmul(self.kv_sel_cur, k)
            v_all = torch.matmul(self.kv_sel_hist, c[vname]) + torch.matmul(self.kv_sel_cur, v)
            out[kname] = k_all[:, :, -kv:]
            out[vname] = v_all[:, :, -kv:]
            h = layer.finish(h, attend(q, k_all, v_all, bias))
        return t.output_proj(t.norm(h))

    def forward(self, audio_codes, freqs_in, cache_valid, cache_in):
        c, out = self._split(cache_in), {}
        n = cache_in.shape[0]
        h = self._decode(self._quantize(audio_codes[:, 0]), freqs_in, cache_valid, c, out)
        wav = h.clamp(min=-1.0, max=1.0).reshape(n, -1)
        return wav, torch.cat([out[e.name].reshape(n, -1) for e in self.layout.entries], dim=1)
