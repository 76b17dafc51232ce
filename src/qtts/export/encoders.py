"""ONNX export of the two encoders used for voice cloning (reference audio -> prompt inputs).

* ``speaker_encoder``: input ``mel [B, frames, 128]`` float32 (from the numpy front end
  :func:`qtts.audio.mel.log_mel`, which stays on the host), output ``embedding [B, enc_dim]``;
  ``B`` and ``frames`` are dynamic.
* ``speech_encoder``: input ``wav [B, samples]`` float32 24 kHz (right-padded with zeros for a
  batch), output ``codes [B, 16, frames]`` int64 with ``frames = ceil(samples / 1920)``;
  ``B`` and ``samples`` are dynamic. Cut each row to ``ceil(len_i / 1920)`` frames like the
  official wrapper (see :meth:`qtts.model.speech_encoder.Encoder.encode_list`).

Both modules export as they are (no op swaps): reflect/replicate padding, SDPA (causal) and
the cdist-equivalent matmul + ArgMin are standard ONNX (opset 17, TorchScript exporter).
"""

from __future__ import annotations

from ..errors import require


def export_speaker_encoder(model, path: str, frames: int = 200) -> dict:
    """Export a :class:`qtts.model.speaker.SpeakerEncoder`; returns its manifest description."""
    torch = require("torch", "export", "ONNX export")
    from .write import export_graph

    cfg = model.config
    example = torch.randn(1, frames, cfg.mel_dim)
    dyn = {"mel": {0: "batch", 1: "frames"}, "embedding": {0: "batch"}}
    export_graph(model.eval(), (example,), path, ["mel"], ["embedding"], dyn)
    return {"inputs": {"mel": ["batch", "frames", cfg.mel_dim]}, "outputs": {"embedding": ["batch", cfg.enc_dim]},
            "front_end": "qtts.audio.mel.log_mel (24 kHz)"}  # fmt: skip


def export_speech_encoder(model, path: str, seconds: float = 2.0) -> dict:
    """Export a :class:`qtts.model.speech_encoder.Encoder`; returns its manifest description."""
    torch = require("torch", "export", "ONNX export")
    from .write import export_graph

    example = 0.1 * torch.randn(1, int(seconds * model.config.sampling_rate))
    dyn = {"wav": {0: "batch", 1: "samples"}, "codes": {0: "batch", 2: "frames"}}
    export_graph(model.eval(), (example,), path, ["wav"], ["codes"], dyn)
    return {"inputs": {"wav": ["batch", "samples"]}, "outputs": {"codes": ["batch", model.valid_quantizers, "frames"]},
            "samples_per_frame": model.samples_per_frame}  # fmt: skip
