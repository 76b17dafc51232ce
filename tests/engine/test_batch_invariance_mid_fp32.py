"""Batch invariance (tests/engine/test_batch_invariance.py says what and why) at the real widths
(mid Base checkpoint: hidden 1024, head_dim 128, the 3072-wide codec head) on the fp32 plans:
``torch`` (the torch fp32 reference, no bundle) and ``faithful`` (the fp32 ONNX bundle). The
quantized presets on mid are in test_batch_invariance_mid_int.py: one module each, so CI's two
workers (``--dist loadfile``) run them side by side.
"""

from __future__ import annotations

from support.batch_invariance import (  # noqa: F401  (collected here, with this module's fixtures)
    preset_parts_fixture,
    test_rows_are_bitwise_alone_in_batches_of_one_to_four,
    test_streams_equal_alone_with_arrivals_and_a_cancellation,
)

#: (checkpoint size, plan)
CASES = [("mid", "torch"), ("mid", "faithful")]

preset_parts = preset_parts_fixture(CASES)
