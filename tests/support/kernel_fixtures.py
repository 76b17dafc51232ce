"""The fixtures both kernel test modules use: ``lib, _kernels_on = kernel_fixtures()`` in
tests/kernels/test_kernel_library.py and test_decoder_layer.py (a conftest.py in tests/kernels would
shadow the root conftest that other tests import by name). They fail, never skip, when the library
cannot be built."""

from __future__ import annotations

import pytest

from qtts import kernels


def kernel_fixtures() -> tuple:
    """(``lib``: the built library's path, once per module; ``_kernels_on``: autouse, the library
    switched on for every test, also when the suite runs with QTTS_KERNELS=0)."""

    @pytest.fixture(scope="module")
    def lib() -> str:
        result = kernels.build()
        assert result.path is not None, f"the kernel library did not build: {result.reason}"
        return result.path

    @pytest.fixture(autouse=True)
    def _kernels_on(monkeypatch):
        monkeypatch.setenv(kernels.ENV, "1")

    return lib, _kernels_on
