"""Batch invariance on every plan: a stream's codes are bitwise the same alone and in any batch.

On the quantized presets (``fast``: int8, ``fastest``: int4) onnxruntime's MatMulNBits kernels
compute a row that shares the kernel with a second row (rows are taken in pairs) differently in the
last bits from a row computed on its own (an odd row count's last row); on the ``torch`` plan MKL
picks its fp32 GEMM kernel by the row count. A near-tie between two logits then picks another code,
and with sampling a stream's whole continuation moves. So on a batched engine (``qtts serve
--max-batch N``) a stream's audio depended on how many streams were stepped with it. The batched
ONNX backend now runs every talker step and predictor frame on an even number of rows, the torch
batch seam every linear layer on groups of 3 rows (``qtts.backends.torch_rows``), so a stream alone
on the engine (a batch of one) and in a batch of any size is the same computation for every row
(``faithful``, fp32 ONNX: MLAS rows never depended on the row count). These tests compare logits
bitwise (stronger than codes: on ``torch`` only they fail without the fix, the random checkpoints
having no near-tie), then whole streams: mixed modes and lengths, greedy and seeded, a mid-stream
arrival and a cancellation.

The tests and fixtures are in tests/support/batch_invariance.py; this module runs them on the tiny
checkpoint (every plan), test_batch_invariance_mid_fp32.py and test_batch_invariance_mid_int.py on
the real widths (mid: hidden 1024, head_dim 128, the 3072-wide codec head, block-128 rows of real
K), so that CI's two workers share the cases (``--dist loadfile`` runs a module on one worker).
"""

from __future__ import annotations

from support.batch_invariance import (  # noqa: F401  (collected here, with this module's preset_parts)
    preset_parts_fixture,
    test_rows_are_bitwise_alone_in_batches_of_one_to_four,
    test_streams_equal_alone_with_arrivals_and_a_cancellation,
)

#: (checkpoint size, plan): every plan on the tiny checkpoint. ``torch`` is the torch fp32 reference
#: (no bundle); the others are presets (ONNX bundles: fp32, int8, int4)
CASES = [("tiny", "torch"), ("tiny", "faithful"), ("tiny", "fast"), ("tiny", "fastest")]

preset_parts = preset_parts_fixture(CASES)
