"""``impl: qnn`` speech decoder: the ONNX vocoder step of `qtts export vocoder` on Qualcomm QNN HTP.

Same artifacts as ``impl: onnx`` (``main`` and optional ``first`` step graphs; the step already
squares with ``x * x`` and folds SnakeBeta's ``exp``, so the HTP ``Pow(-0, 2)`` bug cannot
bite); the sessions run on the QNN execution provider with CPU fallback disabled, in HTP fp16
(emulated on x86). Plan options: ``soc_model`` ("57"), ``fp16`` (true); see :mod:`qtts.qnn`.
"""

from __future__ import annotations

from .decoders import OnnxStepDecoder


class QnnStepDecoder(OnnxStepDecoder):
    """:class:`~qtts.decoders.OnnxStepDecoder` whose sessions are QNN EP sessions."""

    def __init__(self, main: str, first: str | None = None, options=None):
        from .qnn import QnnOptions, qnn_session

        opts = options if isinstance(options, QnnOptions) else QnnOptions.from_plan(options)
        super().__init__(main, first, session_factory=lambda path: qnn_session(path, opts))
