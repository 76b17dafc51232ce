"""The voice store (qtts.voice.store): publish, refuse overwrite, delete, racing writers, a crash
mid-write, and the HTTP server's mapping of its refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from qtts.voice import Voice
from qtts.voice import store as vs

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _voice(seed: int) -> Voice:
    return Voice(np.random.default_rng(seed).standard_normal(16), model_size="0b6", name=f"v{seed}")


def _entries(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_add_lists_and_loads(tmp_path):
    store = vs.VoiceStore(str(tmp_path / "voices"))
    store.add(_voice(1), "me")
    assert [v["id"] for v in store.list()] == ["me"] and store.exists("me")
    np.testing.assert_array_equal(store.load("me").speaker, _voice(1).speaker)
    assert _entries(store.directory) == ["me.voice"]  # no temporary file left


def test_refuses_overwrite_and_leaves_the_voice(tmp_path):
    store = vs.VoiceStore(str(tmp_path))
    store.add(_voice(1), "me")
    before = (tmp_path / "me.voice").read_bytes()
    with pytest.raises(vs.VoiceExists) as info:
        store.add(_voice(2), "me")
    assert info.value.code == "voice_exists" and info.value.field == "name"
    assert (tmp_path / "me.voice").read_bytes() == before and _entries(tmp_path) == ["me.voice"]
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / "link.voice"))  # a symlink takes the name too
    with pytest.raises(vs.VoiceExists):
        store.add(_voice(2), "link")
    assert not (tmp_path / "elsewhere").exists()


def test_reserve_is_exclusive(tmp_path):
    store = vs.VoiceStore(str(tmp_path))
    store.reserve("me")
    with pytest.raises(vs.VoiceExists):
        store.reserve("me")
    store.unreserve("me")
    store.reserve("me")
    store.add(_voice(1), "you")
    with pytest.raises(vs.VoiceExists):
        store.reserve("you")


def test_delete(tmp_path):
    store = vs.VoiceStore(str(tmp_path))
    store.add(_voice(1), "me")
    store.load("me")
    store.delete("me")
    assert store.list() == [] and not store.exists("me")
    with pytest.raises(vs.UnknownVoice) as info:
        store.delete("me")
    assert info.value.field == "voice_id"
    with pytest.raises(vs.UnknownVoice):
        store.load("me")  # the cache forgot it
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(str(target), str(tmp_path / "link.voice"))
    store.delete("link")  # the link itself, never its target
    assert target.read_bytes() == b"keep" and not os.path.lexists(tmp_path / "link.voice")
    (tmp_path / "dir.voice").mkdir()
    with pytest.raises(vs.NotAVoice):
        store.delete("dir")
    assert (tmp_path / "dir.voice").is_dir()


@pytest.mark.parametrize("bad", ["../x", "a/b", "a\n", "", "x" * 65, "a.b", None])
def test_invalid_ids_name_no_file(tmp_path, bad):
    store = vs.VoiceStore(str(tmp_path))
    for call in (store.path_for, store.load, store.delete, store.reserve):
        with pytest.raises(vs.InvalidVoiceId):
            call(bad)


def test_a_store_without_folder_refuses_writes(tmp_path):
    store = vs.VoiceStore(None)
    assert not store.enabled and store.list() == [] and not store.exists("me")
    with pytest.raises(vs.StoreDisabled):
        store.temp_path(".upload")
    with pytest.raises(vs.UnknownVoice):
        store.load("me")


def test_racing_writers_one_wins(tmp_path):
    """Writers with separate stores (as separate processes have) race for one name: exactly one
    publishes, the others get VoiceExists, and the file is the winner's, whole."""
    folder, n = str(tmp_path), 8
    stores = [vs.VoiceStore(folder) for _ in range(n)]
    barrier, results = threading.Barrier(n), [None] * n

    def write(i: int) -> None:
        barrier.wait()
        try:
            stores[i].add(_voice(i), "me")
            results[i] = "won"
        except vs.VoiceExists:
            results[i] = "exists"

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("won") == 1 and results.count("exists") == n - 1, results
    winner = results.index("won")
    np.testing.assert_array_equal(Voice.load(os.path.join(folder, "me.voice")).speaker, _voice(winner).speaker)
    assert _entries(folder) == ["me.voice"]


_CRASH = r"""
import os, sys
from qtts.voice.store import VoiceStore
store = VoiceStore(sys.argv[1])
tmp = store.temp_path(".voice.part")
with open(tmp, "wb") as fh:
    fh.write(open(sys.argv[2], "rb").read()[:100])  # half a voice file
    fh.flush()
    os._exit(9)  # the process dies before publishing
"""


def test_a_crash_mid_write_leaves_no_voice(tmp_path):
    folder = tmp_path / "voices"
    whole = tmp_path / "whole.voice"
    _voice(1).save(str(whole))
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-c", _CRASH, str(folder), str(whole)], env=env, capture_output=True)
    assert out.returncode == 9, out.stderr
    (left,) = _entries(folder)  # the hidden temporary file, never a voice
    assert left.startswith(vs.TEMP_PREFIX)
    store = vs.VoiceStore(str(folder))
    assert store.list() == [] and _entries(folder) == [left]  # young: may be an upload in progress
    (folder / ".qtts-abc.voice.part").write_bytes(b"half")  # a crashed Voice.save
    old = time.time() - vs.STALE_TEMP_S - 60
    for name in _entries(folder):
        os.utime(folder / name, (old, old))
    vs.VoiceStore(str(folder))  # a store opening sweeps what crashes left
    assert _entries(folder) == []


def test_a_failed_save_leaves_nothing(tmp_path):
    class Broken:
        def save(self, path):
            with open(path, "wb") as fh:
                fh.write(b"half")
            raise OSError(28, "No space left on device")

    store = vs.VoiceStore(str(tmp_path))
    with pytest.raises(OSError):
        store.add(Broken(), "me")
    assert _entries(tmp_path) == []


def test_store_imports_no_torch_no_fastapi():
    code = "import sys, qtts.voice.store; print(sorted({'torch', 'fastapi', 'starlette'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC), capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_server_answers_store_refusals_as_http(tmp_path):
    from qtts.server.errors import ApiError
    from qtts.server.voices import VoiceStore, check_voice_id

    store = VoiceStore(str(tmp_path))
    store.add(_voice(1), "me")
    cases = [(lambda: store.add(_voice(2), "me"), 409, "voice_exists", "name"),
             (lambda: store.load("nobody"), 404, "voice_not_found", "voice"),
             (lambda: store.delete("nobody"), 404, "voice_not_found", "voice_id"),
             (lambda: store.load("../x"), 400, "invalid_voice_id", "voice"),
             (lambda: check_voice_id("a b", "name"), 400, "invalid_voice_id", "name"),
             (lambda: VoiceStore(None).temp_path(".upload"), 403, "uploads_disabled", None)]
    (tmp_path / "dir.voice").mkdir()
    cases.append((lambda: store.delete("dir"), 409, "not_a_voice", "voice_id"))
    for call, status, code, param in cases:
        with pytest.raises(ApiError) as info:
            call()
        assert (info.value.status, info.value.code, info.value.param) == (status, code, param), info.value.message
