"""The streaming vocoder step with its convolution stack in bf16 (issue 36).

:class:`VocoderStepBF16` is :class:`~qtts.model.vocoder_step.VocoderStep` (same inputs, outputs
and cache layout, so one host drives either) whose decoder convolutions, 4.7 of the step's
4.8 GFLOP per frame, run in bf16:

* activations are rows: ``[T, C]`` (time-major, channels contiguous), the layout oneDNN's
  bf16 convolutions (AMX, AVX512-BF16) compute in, so no tensor is reordered per call;
* weights are cast to bf16 and packed once into oneDNN's blocked layout for the widths of the
  steps a vocoder runs (:class:`RowConv`, :func:`step_sizes`: the main step and the powers of two
  below it); steps built without packing and torch without oneDNN run the same bf16 convolution
  through ``F.conv1d``;
* a transposed convolution (kernel 2s, stride s) is a convolution of kernel 2 over
  ``[previous frame, frame]`` with ``s * out`` channels, output channel ``r * out + o`` being
  sample ``r`` of the frame: in rows its output *is* the upsampled signal, a free reshape;
* what bf16 would round too coarsely stays fp32: the residual stream (each unit adds its bf16
  convolution's output to an fp32 sum), SnakeBeta (computed in fp32 and written, rounded to bf16
  once, straight into the next convolution's input buffer: ``snake``, the fused kernel of
  ``qtts.kernels``, else torch ops), the transposed convolutions' biases, the upsampling
  transposed convolutions, the pre-convolution, the norms and attention of the pre-transformer,
  and the state (the bf16 histories are exact in fp32);
* the pre-transformer's and the upsampling ConvNeXt blocks' linear layers run in bf16
  (:class:`BF16Linear`, packed weights): their fp32 matmuls at 8 rows were a sixth of the step.

Fidelity against the fp32 step is measured against the bf16 bar (docs/fidelity.md): the model's
authors ran every evaluation in bf16, and this step sits ~5 dB closer to fp32 than the decoder
cast to bf16 does (full size, random weights).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .vocoder import RESIDUAL_DILATIONS, Decoder
from .vocoder_step import VocoderStep

BF16 = torch.bfloat16
#: input widths a convolution keeps packed weights for (:class:`RowConv`): one per step size of
#: :func:`step_sizes` (4 for the default main step of 8 frames, 8 for a main step of up to 128)
MAX_PACKS = 8


def step_sizes(main: int) -> list[int]:
    """The bf16 steps a vocoder runs, largest first: ``main`` and the powers of two below it.

    Every chunk then decodes in steps of these sizes (``main`` while it fits, then the largest that
    fits: 7 frames = 4 + 2 + 1), each on weights packed for it. A step of any other size would run
    oneDNN's bf16 convolutions on unpacked weights, reordered on every call: measured on the Zen 4
    VM (docs/history/performance.md, 2026-12-06), a 2-frame step cost 384 ms of CPU and a 4-frame one
    439 ms against 84 and 139 packed (231-243 for 8 frames), stalling a stream after its first frame
    and at every utterance's last frames."""
    main = int(main)
    sizes = [main] + [1 << k for k in range(main.bit_length()) if (1 << k) < main]
    if main < 1 or len(sizes) > MAX_PACKS:
        raise InputError(f"a bf16 vocoder main step of {main} frames is not supported; "
                         f"set the vocoder option main to 1 .. {1 << (MAX_PACKS - 1)} (the default is 8)")
    return sorted(sizes, reverse=True)


def onednn_bf16() -> bool:
    """True when torch's oneDNN runs bf16 convolutions natively here (AVX512-BF16 or AMX)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class RowConv:
    """A 1-D convolution (stride 1, no padding) on rows ``[T, cin]`` bf16 -> ``[T - ctx, cout]`` bf16.

    oneDNN picks its weight blocking from the input's width; weights packed for one width and used
    at another are converted on every call, for some shapes by a generic reorder (~0.4 s for a
    768 x 768 x 7 weight, measured with torch 2.13's oneDNN). So a call with ``pack=True`` uses
    weights packed for exactly its width (packed on the first such call, at most
    :data:`MAX_PACKS` widths: one per step size of :func:`step_sizes`), and every other call the
    bf16 weights through ``F.conv1d`` (cast from fp32 per call and reordered: slow, for tests and
    steps built with ``pack=False``).

    Packed and plain calls agree bit for bit where oneDNN runs both on AMX (the Intel Xeon VM); with
    AVX512-BF16 alone (AMD Zen 4) their kernels sum in other orders and ~0.05 % of the outputs land
    on the neighbouring bf16 value. Only the steps built with ``pack=True`` pack (TorchVocoder: those
    of :func:`step_sizes`), so a width always takes the same path and a decode's bits never depend
    on what ran before it."""

    def __init__(self, weight, bias: torch.Tensor | None, dilation: int = 1, packed: bool = True):
        """``weight``: the fp32 ``[cout, cin, k]`` tensor, or a function returning it (computed when
        needed: only packs and the unpacked calls read it, so no bf16 copy is kept besides the packs)."""
        fixed = None if callable(weight) else weight.detach()
        self._source = weight if fixed is None else (lambda: fixed)
        cout, cin, k = self._source().shape
        self.cout, self.cin, self.dilation = int(cout), int(cin), int(dilation)
        self.context = (int(k) - 1) * self.dilation
        self.bias = None if bias is None else bias.detach().to(BF16).contiguous()
        self.can_pack = bool(packed and onednn_bf16())
        self.packs: dict[int, torch.Tensor] = {}  # input rows -> weights packed for that width

    @property
    def weight(self) -> torch.Tensor:
        """The bf16 weights (cast now from the fp32 source)."""
        return self._source().detach().to(BF16).contiguous()

    def _packed(self, width: int) -> torch.Tensor | None:
        if width not in self.packs and len(self.packs) < MAX_PACKS:
            self.packs[width] = torch._C._nn.mkldnn_reorder_conv2d_weight(
                self.weight.unsqueeze(2).to_mkldnn(), [0, 0], [1, 1], [1, self.dilation], 1, [1, self.cin, 1, width]
            )  # two threads racing here store equal packs
        return self.packs.get(width)

    def __call__(self, rows: torch.Tensor, pack: bool = True) -> torch.Tensor:
        x = rows.t()  # [cin, T] with row strides: oneDNN's nwc
        packed = self._packed(int(rows.shape[0])) if pack and self.can_pack else None
        if packed is not None:
            y = torch.ops.mkldnn._convolution_pointwise(
                x[None, :, None, :], packed, self.bias, [0, 0], [1, 1], [1, self.dilation], 1, "none", [], ""
            )
            return y[0, :, 0, :].t()  # channels-last output: rows again, no copy
        return F.conv1d(x[None], self.weight, self.bias, dilation=self.dilation)[0].t().contiguous()


class BF16Linear(nn.Module):
    """``nn.Linear`` in bf16: fp32 in and out, the matmul on bf16 weights, packed by oneDNN for the
    row counts in ``pack_rows`` (declared by the steps that pack: :meth:`VocoderStepBF16.__init__`),
    plain bf16 ``F.linear`` at any other count. Declared, not first-come: which calls run packed
    never depends on the order requests arrived in (the bits can differ without AMX: :class:`RowConv`)."""

    def __init__(self, linear: nn.Linear, packed: bool = True):
        super().__init__()
        self._fp32 = (linear.weight,)  # the source (not a parameter of this module): cast when needed
        self.bias = None if linear.bias is None else linear.bias.detach().to(BF16).contiguous()
        self.can_pack = bool(packed and onednn_bf16())
        self.pack_rows: set[int] = set()
        self.packs: dict[int, torch.Tensor] = {}

    def weight(self) -> torch.Tensor:
        return self._fp32[0].detach().to(BF16).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(BF16)
        n = int(rows.shape[0])
        if self.can_pack and n in self.pack_rows and n not in self.packs:
            self.packs[n] = torch.ops.mkldnn._reorder_linear_weight(self.weight(), n)  # racing threads: equal packs
        packed = self.packs.get(n) if self.can_pack else None
        if packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(rows, packed, self.bias, "none", [], "")
        else:
            y = F.linear(rows, self.weight(), self.bias)
        return y.float().reshape(*x.shape[:-1], -1)


def bf16_linears(module: nn.Module, packed: bool = True) -> nn.Module:
    """A copy of ``module`` whose ``nn.Linear`` layers are :class:`BF16Linear` (the rest stays fp32)."""
    linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    memo = {}
    for name in linears:  # the fp32 weights being replaced are not copied
        lin = module.get_submodule(name)
        memo.update({id(p): None for p in (lin.weight, lin.bias) if p is not None})
    out = copy.deepcopy(module, memo)
    for name in linears:
        parent, _, leaf = name.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, leaf, BF16Linear(module.get_submodule(name), packed))
    return out


#: an integer type as wide as two elements of a weight's type: a pair of taps moves as one value
_PAIRS = {2: torch.int32, 4: torch.int64}


def polyphase(weight: torch.Tensor, stride: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """ConvTranspose1d weight ``[cin, cout, 2s]`` -> conv weight ``[s * cout, cin, 2]`` over
    ``[x[m-1], x[m]]``: output sample ``m*s + r`` of channel ``o`` is channel ``r * cout + o``.

    ``dtype``: cast first (bf16: half the bytes to move). The tap pairs move as one integer each, in
    two plain transposes rather than one strided gather of 2-element pieces: the first upsampler's
    1536 x 768 x 16 in ~0.1 s instead of ~0.22 s on one Zen 4 thread, paid once per width a step packs
    (the same values, tests/model/test_vocoder_step_bf16.py)."""
    cin, cout, k = weight.shape
    if k != 2 * stride:
        raise ValueError(f"polyphase needs kernel == 2 * stride, got kernel {k}, stride {stride}")
    w = weight if dtype is None else weight.to(dtype)
    halves = w.reshape(cin, cout, 2, stride)
    taps = torch.stack([halves[:, :, 1], halves[:, :, 0]], dim=-1)  # [cin, cout, s, 2]
    pair = _PAIRS.get(taps.element_size())
    if pair is None:  # float64: no integer type of 16 bytes
        return taps.permute(2, 1, 0, 3).reshape(stride * cout, cin, 2)
    pairs = taps.view(pair).reshape(cin, cout, stride).transpose(1, 2).reshape(cin, stride * cout)
    return pairs.t().contiguous().view(w.dtype).view(stride * cout, cin, 2)


class VocoderStepBF16(VocoderStep):
    """:class:`VocoderStep` with the decoder's convolutions in bf16 (module docstring)."""

    def __init__(self, decoder: Decoder, codes_length: int, like: VocoderStep | None = None,
                 packed: bool = True, snake=None, pack: bool = True, pack_linears: bool | None = None):  # fmt: skip
        """``packed``: oneDNN-packed weights where available (False: ``F.conv1d``, for tests), and
        ``pack``: the convolutions' for this step's widths (False: plain bf16 calls, slow);
        ``pack_linears``: the pre-transformer's for this step's row count (None: as ``pack``; an
        unpacked linear only casts its weights per call, ~10 ms, where a pack keeps a copy);
        ``snake``: a fused ``(rows, a, inv_b) -> bf16 rows`` (``qtts.kernels.rows.snake_rows``),
        None (or returning None): torch ops."""
        super().__init__(decoder, codes_length, like=like)
        self.snake_kernel, self.pack = snake, bool(pack)
        pack_linears = self.pack if pack_linears is None else bool(pack_linears)
        convs = getattr(like, "row_convs", None) if isinstance(like, VocoderStepBF16) else None
        self.row_convs = convs if convs is not None else self._row_convs(decoder, packed)
        shared = getattr(like, "_bf16_transformer", None) if isinstance(like, VocoderStepBF16) else None
        self._bf16_transformer = shared or (bf16_linears(decoder.pre_transformer, packed),)  # not a submodule
        if pack_linears:  # the pre-transformer runs on one row per frame
            for m in self._bf16_transformer[0].modules():
                if isinstance(m, BF16Linear):
                    m.pack_rows.add(int(codes_length))
        mats = getattr(like, "upsample_mats", None) if isinstance(like, VocoderStepBF16) else None
        self.upsample_mats = mats if mats is not None else self._upsample_mats(decoder)

    @staticmethod
    def _upsample_mats(decoder: Decoder) -> list:
        """Per upsampling stage: the transposed conv (kernel = stride) as a bf16 matrix
        ``[cin, s * cout]`` (column ``r * cout + o``: sample r, channel o) and the ConvNeXt MLP's
        bf16 weights."""
        out = []
        for convt, block in decoder.upsample:
            w = convt.conv.weight.detach()  # [cin, cout, s]
            if w.shape[-1] != convt.stride:
                raise ValueError("an upsampling transposed conv with kernel != stride")
            mat = w.permute(0, 2, 1).reshape(w.shape[0], -1).contiguous()
            lin = [t.detach().to(BF16) for t in (block.pwconv1.weight, block.pwconv1.bias,
                                                 block.pwconv2.weight, block.pwconv2.bias)]  # fmt: skip
            out.append((mat, convt.conv.bias.detach().float(), *lin))
        return out

    @staticmethod
    def _row_convs(decoder: Decoder, packed: bool) -> dict:
        convs = {}
        for name, mod in decoder.decoder.named_modules():
            key = f"decoder.{name.removesuffix('.conv')}"
            if isinstance(mod, torch.nn.Conv1d):
                convs[key] = RowConv(mod.weight, mod.bias, mod.dilation[0], packed)
            elif isinstance(mod, torch.nn.ConvTranspose1d):
                s = int(mod.stride[0])
                conv = RowConv(lambda mod=mod, s=s: polyphase(mod.weight.detach(), s, BF16), None, 1, packed)
                conv.stride, conv.out_bias = s, mod.bias.detach().float()
                convs[key] = conv
        return convs

    def pre_transformer(self) -> nn.Module:
        return self._bf16_transformer[0]

    def _rows_conv(self, name: str, rows: torch.Tensor, c: dict, out: dict, snake: str | None = None):
        """Causal bf16 conv over [history; rows] (``snake``: over [history; SnakeBeta(rows)]), the
        input written once into one buffer (no concatenation); the new history is its last rows."""
        hist = c[name]  # [C, context] fp32: the state keeps the bf16 values exactly
        ctx = hist.shape[-1]
        xin = torch.empty(ctx + rows.shape[0], rows.shape[1], dtype=BF16)
        xin[:ctx] = hist.t()
        if snake is None:
            xin[ctx:] = rows
        else:
            self._rows_snake(snake, rows, xin[ctx:])
        out[name] = xin[-ctx:].t()
        return self.row_convs[name](xin, self.pack)

    def _rows_convt(self, name: str, rows: torch.Tensor, c: dict, out: dict, snake: str) -> torch.Tensor:
        """Causal transposed conv as its polyphase conv: [L, cin] -> [L * s, cout] fp32."""
        conv = self.row_convs[name]
        y = self._rows_conv(name, rows, c, out, snake)  # [L, s * cout]
        return y.reshape(-1, conv.out_bias.shape[0]) + conv.out_bias

    def _rows_snake(self, name: str, rows: torch.Tensor, dest: torch.Tensor) -> None:
        """SnakeBeta in fp32 on rows (fp32 or bf16 in), rounded to bf16 once, into ``dest``."""
        m = self.snakes[self._snake_index[name]]
        a, inv_b = m.a.view(1, -1), m.inv_b.view(1, -1)
        if self.snake_kernel is not None and self.snake_kernel(rows, a, inv_b, out=dest) is not None:
            return
        s = torch.sin(rows * a)
        dest.copy_(torch.addcmul(rows, inv_b, s * s))

    def _decode(self, latent, freqs_in, cache_valid, c: dict, out: dict) -> torch.Tensor:
        dec = self.decoder
        h = self._conv("pre_conv", latent, c, out)
        h = self._transformer(h.transpose(1, 2), freqs_in, cache_valid, c, out).transpose(1, 2)
        for i, (_, block) in enumerate(dec.upsample):
            mat, bias, w1, b1, w2, b2 = self.upsample_mats[i]
            up = torch.matmul(h[0].t(), mat)  # [T, s * cout]
            h = (up.reshape(-1, bias.shape[0]) + bias).t()[None]
            x = block.norm(self._conv(f"upsample.{i}.1.dwconv", h, c, out).transpose(1, 2)).to(BF16)
            mlp = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
            h = h + (block.gamma * mlp.float()).transpose(1, 2)
        rows = self._rows_conv("decoder.0", h[0].t(), c, out).float()
        for b in range(1, len(dec.decoder) - 2):
            rows = self._rows_convt(f"decoder.{b}.block.1", rows, c, out, snake=f"decoder.{b}.block.0")
            for j in range(2, 2 + len(RESIDUAL_DILATIONS)):
                unit = f"decoder.{b}.block.{j}"
                y = self._rows_conv(unit + ".conv1", rows, c, out, snake=unit + ".act1")
                act = torch.empty_like(y)
                self._rows_snake(unit + ".act2", y, act)
                rows += self.row_convs[unit + ".conv2"](act, self.pack)
        last = len(dec.decoder) - 1
        return self._rows_conv(f"decoder.{last}", rows, c, out, snake=f"decoder.{last - 1}")  # [T, 1] bf16

    def forward(self, audio_codes, freqs_in, cache_valid, cache_in):
        c, out = self.layout.split(cache_in), {}
        h = self._decode(self._quantize(audio_codes), freqs_in, cache_valid, c, out)
        wav = h.float().clamp(min=-1.0, max=1.0).reshape(-1)
        state = torch.empty(self.layout.size, dtype=torch.float32)
        for e in self.layout.entries:  # each entry written once into the new state (no cat of copies)
            state[e.offset : e.offset + e.size].view(e.shape).copy_(out[e.name])
        return wav, state
