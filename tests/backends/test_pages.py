"""2 MB pages for the weights onnxruntime prepacks (qtts.backends.advise_huge_pages): large resident anonymous
mappings are collapsed into huge pages, sparse ones never grow, QTTS_HUGE_PAGES=0 turns it off, and
opening an onnx plan asks for them (a torch plan does not)."""

from __future__ import annotations

import ctypes
import mmap

import pytest

import qtts.backends as backends

MB = 1 << 20


def _mapping(size: int, touch: bool):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if touch:
        m.write(b"x" * size)
    else:
        m[0] = 1  # one resident page
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def _smaps(addr: int) -> dict:
    """The smaps fields (kB) of the mapping that holds ``addr``."""
    fields, inside = {}, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:
                if inside:
                    break
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = lo <= addr < hi
            elif inside and len(head) >= 2 and head[1].isdigit():
                fields[head[0].rstrip(":")] = int(head[1])
    return fields


def test_the_ci_kernel_offers_huge_pages():
    """The CI machines run Linux with transparent huge pages available (else the tests below would
    prove nothing); QTTS_HUGE_PAGES is not set there."""
    assert backends.thp_mode() in ("always", "madvise") and backends.huge_pages_enabled()


def test_a_large_resident_mapping_is_collapsed():
    m, addr = _mapping(64 * MB, touch=True)
    try:
        assert _smaps(addr).get("AnonHugePages", 0) == 0 or backends.thp_mode() == "always"
        assert any(lo <= addr < lo + n for lo, n in backends.huge_page_candidates())
        assert backends.advise_huge_pages() >= 64 * MB
        assert _smaps(addr)["AnonHugePages"] >= 32 * 1024  # kB: most of it now in 2 MB pages
    finally:
        m.close()


def test_a_sparse_mapping_is_left_alone():
    m, addr = _mapping(64 * MB, touch=False)
    try:
        before = _smaps(addr)["Rss"]
        assert not any(lo <= addr < lo + n for lo, n in backends.huge_page_candidates())
        backends.advise_huge_pages()
        assert _smaps(addr)["Rss"] == before < 1024  # kB: collapsing would have filled it to 64 MB
    finally:
        m.close()


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_switch_turns_it_off(monkeypatch, value):
    monkeypatch.setenv(backends.HUGE_PAGES_ENV, value)
    m, addr = _mapping(16 * MB, touch=True)
    try:
        assert not backends.huge_pages_enabled() and backends.advise_huge_pages() == 0
        assert _smaps(addr).get("AnonHugePages", 0) == 0 or backends.thp_mode() == "always"
    finally:
        m.close()


def test_opening_an_onnx_plan_asks_for_them_and_torch_does_not(monkeypatch, tiny_snapshot, tiny_bundle):
    calls = []
    monkeypatch.setattr(backends, "advise_huge_pages", lambda *a, **k: calls.append("advise") or 0)
    backends.open(tiny_snapshot(kind="custom_voice"), plan="torch")
    assert calls == []
    bundle = tiny_bundle("custom_voice", "--vocoder-first", "2", "--vocoder-main", "4")  # test_onnx_engine's
    backends.open(tiny_snapshot(kind="custom_voice"), plan=f"{bundle}/plan.json")
    assert calls == ["advise"]
