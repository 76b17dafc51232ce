"""Batch invariance (tests/engine/test_batch_invariance.py says what and why) at the real widths
(mid Base checkpoint: hidden 1024, head_dim 128, the 3072-wide codec head, block-128 rows of real
K) on the quantized presets: ``fast`` (int8) and ``fastest`` (int4) ONNX bundles. The fp32 plans
on mid are in test_batch_invariance_mid_fp32.py: one module each, so CI's two workers
(``--dist loadfile``) run them side by side.
"""

from __future__ import annotations

from support.batch_invariance import (  # noqa: F401  (collected here, with this module's fixtures)
    preset_parts_fixture,
    test_rows_are_bitwise_alone_in_batches_of_one_to_four,
    test_streams_equal_alone_with_arrivals_and_a_cancellation,
)

#: (checkpoint size, plan)
CASES = [("mid", "fast"), ("mid", "fastest")]

preset_parts = preset_parts_fixture(CASES)
