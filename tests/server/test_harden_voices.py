"""(6) The voices directory under churn and odd entries, against a real uvicorn on 127.0.0.1 (fake
engine): no 500, symlinks never followed or listed, DELETE removes only the named entry, a
directory named x.voice is a 4xx, and a voice file rewritten with its old mtime is read again."""

from __future__ import annotations

import os
import random
import threading

import httpx
import numpy as np
import pytest

from support.server_fakes import FakeTTS, FakeVoice
from support.server_util import start_server


@pytest.fixture()
def srv(tmp_path):
    voices = tmp_path / "voices"
    server, app = start_server(FakeTTS(), voices_dir=str(voices), max_queue=8)
    app.state.qtts.store.loader = FakeVoice.load
    server.voices = voices
    yield server
    server.stop()


def ids(server) -> list[str]:
    r = httpx.get(server.url + "/v1/voices", timeout=30)
    assert r.status_code == 200, r.text
    return [v["id"] for v in r.json()["data"] if v["type"] == "voice"]


def speak(client, server, voice: str) -> httpx.Response:
    return client.post(server.url + "/v1/audio/speech", json={"input": "hello", "voice": voice,
                                                              "response_format": "pcm"}, timeout=30)


def test_symlinks_and_directories_are_not_voices(srv, tmp_path):
    d = srv.voices
    FakeVoice(1).save(str(d / "real.voice"))
    outside = tmp_path / "outside.voice"
    FakeVoice(2).save(str(outside))
    os.symlink(d / "real.voice", d / "alias.voice")
    os.symlink(outside, d / "out.voice")
    os.symlink(d / "missing.voice", d / "gone.voice")  # dangling
    os.mkdir(d / "folder.voice")
    assert ids(srv) == ["real"]  # before: 500 (the dangling link), or every link listed
    with httpx.Client() as c:
        assert speak(c, srv, "real").status_code == 200
        for name in ("alias", "out", "gone", "folder"):
            r = speak(c, srv, name)
            assert r.status_code == 404, (name, r.status_code, r.text)
        r = c.delete(srv.url + "/v1/voices/folder")
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_a_voice", r.text
        r = c.delete(srv.url + "/v1/voices/alias")
        assert r.status_code == 200, r.text
    assert not os.path.lexists(d / "alias.voice") and (d / "real.voice").is_file()  # only the link went
    assert outside.is_file() and (d / "folder.voice").is_dir()


def test_churn_never_gives_500(srv):
    """Voices appear, vanish, turn into links and directories while clients list and speak."""
    d, stop = srv.voices, threading.Event()
    names = [f"v{i}" for i in range(6)]

    def churn():
        rng = random.Random(3)
        while not stop.is_set():
            name = rng.choice(names)
            path = d / f"{name}.voice"
            try:
                if os.path.lexists(path):
                    os.rmdir(path) if path.is_dir() and not path.is_symlink() else os.unlink(path)
                else:
                    kind = rng.random()
                    if kind < 0.6:
                        tmp = d / f".tmp-{name}"
                        FakeVoice(rng.randrange(9)).save(str(tmp))
                        os.replace(tmp, path)
                    elif kind < 0.8:
                        os.symlink(d / f"{rng.choice(names)}.voice", path)
                    else:
                        os.mkdir(path)
            except OSError:
                pass

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    statuses = []
    try:
        with httpx.Client() as c:
            for i in range(300):
                r = c.get(srv.url + "/v1/voices", timeout=30) if i % 2 else speak(c, srv, names[i % len(names)])
                statuses.append(r.status_code)
                if i % 3 == 0:
                    statuses.append(c.delete(srv.url + f"/v1/voices/{names[i % 5]}", timeout=30).status_code)
    finally:
        stop.set()
        worker.join(10)
    assert set(statuses) <= {200, 404, 409}, sorted(set(statuses))


def test_a_voice_rewritten_with_its_old_mtime_is_read_again(srv):
    path = srv.voices / "me.voice"
    FakeVoice(1).save(str(path))
    with httpx.Client() as c:
        first = speak(c, srv, "me").content
        st = os.stat(path)
        with open(path, "r+") as fh:  # in place, same size, then the old times back
            fh.write("2")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == st.st_size
        second = speak(c, srv, "me").content
        FakeVoice(2).save(str(srv.voices / "two.voice"))
        expected = speak(c, srv, "two").content
    assert first != second and second == expected


def test_the_file_cache_reads_real_voice_files_by_identity(tmp_path):
    from qtts.voice import Voice
    from qtts.voice.folder import VoiceFileCache

    def voice(x: float) -> Voice:
        return Voice(speaker=np.full(8, x, np.float32), model_type="base", model_size="0.6b", name="n")

    path = str(tmp_path / "a.voice")
    voice(1.0).save(path)
    cache = VoiceFileCache()
    assert float(cache.load(path).speaker[0]) == 1.0
    st = os.stat(path)
    voice(2.0).save(path + ".new")
    os.replace(path + ".new", path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert float(cache.load(path).speaker[0]) == 2.0


def test_the_file_cache_is_bounded(tmp_path):
    """Voice files that come and go on disk (never deleted through the API) are not kept for ever:
    the cache holds at most max_entries, least recently used out first."""
    from qtts.voice import Voice
    from qtts.voice.folder import VoiceFileCache

    cache = VoiceFileCache(max_entries=5)
    for i in range(10):
        path = str(tmp_path / f"v{i}.voice")
        Voice(speaker=np.full(8, float(i), np.float32), model_type="base", model_size="0.6b", name="n").save(path)
        cache.load(path)
        if i == 5:
            cache.load(str(tmp_path / "v2.voice"))  # v2 is used again: it outlives v3 .. v5
    assert [os.path.basename(p) for p in cache._cache] == ["v2.voice", "v6.voice", "v7.voice", "v8.voice", "v9.voice"]
