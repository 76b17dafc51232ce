"""The web page at ``/`` in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

The browser loads the page from ``qtts serve``'s app on loopback, synthesizes with a tiny random
checkpoint through the streaming endpoint (pcm read with fetch + ReadableStream into WebAudio),
and the test checks that audio bytes arrived and played, the stats, the WAV download, a voice
upload, and the layout at phone width. Screenshots go to the test's temp dir; with
``QTTS_SCREENSHOTS=DIR`` they are also written there (docs/web-page*.png come from this test).

No skips: a missing Chromium or Playwright fails with the install command (scripts/test.sh
installs both).
"""

from __future__ import annotations

import json
import os
import shutil
import time

import httpx
import pytest
import soundfile as sf

import qtts
from qtts.text.words import split_words
from support.server_util import start_server, wav_bytes
from support.timestamps_util import PIECE_FRAMES, TEXT, ShortPieces, tiny_aligner

CHROMIUM = "/usr/bin/chromium"
# flags that work as root in a container; a fresh profile comes from Playwright's temp dir
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--autoplay-policy=no-user-gesture-required"]
FRAMES = 12  # the servers' frame cap: about 1 s of audio per request


def _chromium() -> str:
    path = shutil.which("chromium") or CHROMIUM
    if not os.path.exists(path):
        pytest.fail("Chromium is not installed: the web-page test needs Debian's 'chromium' package "
                    "(apt-get install -y chromium; scripts/test.sh installs it)")
    return path


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install 'playwright==1.65.*' (the dev extra); "
                    "it drives the system Chromium, so never run 'playwright install'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def cv17(tiny_snapshot):
    """A 1.7B-layout CustomVoice engine: speakers and an optional instruction on the page."""
    return qtts.load(tiny_snapshot(kind="custom_voice", layout="1.7b"), threads=1)


def wait_js(page, expr: str, timeout: float = 60.0):
    """Poll a JavaScript expression (the page's CSP forbids eval, which wait_for_function needs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = page.evaluate(expr)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {expr}: {page.evaluate('window.qtts && window.qtts.last')}")


def open_page(browser, url: str, **context):
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"{m.text} {m.location.get('url')}"))
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(url + "/")
    return ctx, page, problems


def screenshot(page, tmp_path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    if os.environ.get("QTTS_SCREENSHOTS"):
        shutil.copy(path, os.path.join(os.environ["QTTS_SCREENSHOTS"], name))


def play_and_wait(page) -> dict:
    page.click("#play")
    wait_js(page, "window.qtts.last && (window.qtts.last.done || window.qtts.last.error)")
    last = page.evaluate("({...window.qtts.last, player: null})")
    assert last["error"] is None and last["done"], last
    # played: WebAudio finished at least one of the scheduled buffers
    wait_js(page, "window.qtts.last.player.played > 0", timeout=30)
    return last


def test_page_streams_plays_and_downloads(browser, cv17, tmp_path):
    srv, app = start_server(None, max_frames=FRAMES)
    try:
        ctx, page, problems = open_page(browser, srv.url, viewport={"width": 900, "height": 720},
                                        accept_downloads=True)
        wait_js(page, "document.getElementById('model').textContent.includes('loading')", timeout=20)
        app.state.qtts.set_engine(cv17)  # the page polls until the model is loaded
        wait_js(page, "!document.getElementById('play').disabled")
        voices = page.eval_on_selector_all("#voice option", "els => els.map(e => e.value)")
        assert voices == sorted(cv17.speakers)
        assert page.is_visible("#instruct-field") and not page.is_visible("#upload-card")
        page.select_option("#voice", "ryan")
        page.fill("#text", "Hello from the browser. This plays while it is generated.")
        page.fill("#instruct", "A cheerful, bright voice.")
        last = play_and_wait(page)
        assert last["samples"] == FRAMES * 1920 and last["bytes"] == 2 * last["samples"]
        assert 0 < last["ttfa_ms"] <= last["elapsed_ms"]
        assert page.inner_text("#rtf") not in ("", "–") and float(page.inner_text("#rtf")) > 0
        assert page.inner_text("#audio-s") == "0.96 s" and "ms" in page.inner_text("#ttfa")
        with page.expect_download() as info:
            page.click("#download")
        samples, rate = sf.read(info.value.path(), dtype="int16")
        assert rate == 24000 and len(samples) == last["samples"]
        screenshot(page, tmp_path, "web-page.png")
        loading = "status of 503 (Service Unavailable)"  # Chromium logs the polls while the model loads
        assert [p for p in problems if not (loading in p and p.endswith("/ui/info"))] == []
        ctx.close()
    finally:
        srv.stop()


def test_page_at_phone_width_uploads_a_voice_and_plays_it(browser, real_tts, tmp_path):
    srv, _ = start_server(real_tts, max_frames=FRAMES, voices_dir=str(tmp_path / "voices"))
    clip = tmp_path / "me.wav"
    clip.write_bytes(wav_bytes(seconds=2.0))
    try:
        ctx, page, problems = open_page(browser, srv.url, viewport={"width": 390, "height": 844},
                                        device_scale_factor=2, is_mobile=True, has_touch=True)
        wait_js(page, "!document.getElementById('play').disabled")
        assert page.is_visible("#upload-card") and not page.is_visible("#instruct-field")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling
        page.set_input_files("#clip", str(clip))
        page.fill("#voice-name", "phone_voice")
        page.click("#upload-button")
        wait_js(page, "document.getElementById('upload-status').textContent.includes('saved as')")
        assert page.input_value("#voice") == "phone_voice"
        page.fill("#speed", "1.5")
        last = play_and_wait(page)
        # at 1.5x the (capped) audio is shorter than the frames it came from
        assert last["bytes"] == 2 * last["samples"] and 0 < last["samples"] <= FRAMES * 1920 / 1.5
        for sel in ("#play", "#download", "#speed", "#voice"):
            box = page.locator(sel).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (sel, box)
        screenshot(page, tmp_path, "web-page-phone.png")
        assert problems == []
        ctx.close()
    finally:
        srv.stop()


def test_page_files_and_info_route(cv17):
    srv, _ = start_server(cv17)
    try:
        r = httpx.get(srv.url + "/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["content-security-policy"]
        for name, kind in [("app.js", "text/javascript"), ("words.js", "text/javascript"), ("style.css", "text/css"),
                           ("icon.svg", "image/svg+xml")]:
            r = httpx.get(f"{srv.url}/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and r.content
        for name in ("", "ui/app.js", "ui/words.js", "ui/style.css", "docs", "ui/docs.js"):  # nothing from a CDN or another origin
            text = httpx.get(f"{srv.url}/{name}").text
            assert "http://" not in text and "https://" not in text, name
        info = httpx.get(srv.url + "/ui/info").json()
        assert info["instruct"] and not info["cloning"] and info["speakers"] == sorted(cv17.speakers)
        paths = httpx.get(srv.url + "/openapi.json").json()["paths"]
        assert "/" not in paths and "/ui/info" not in paths  # the page is not part of the API
    finally:
        srv.stop()


def _recorded(ctx) -> list[str]:
    """Every request of every page of ``ctx`` (main documents, scripts, fetches, icons)."""
    urls: list[str] = []
    ctx.on("request", lambda req: urls.append(req.url))
    return urls


def test_pages_contact_only_their_own_origin(browser, cv17):
    """``/`` (with a synthesis) and ``/docs`` in Chromium: every request goes to the server's own
    origin (FastAPI's CDN-loaded Swagger UI and ReDoc are off; /docs renders /openapi.json itself)."""
    srv, _ = start_server(cv17, max_frames=FRAMES)
    try:
        ctx = browser.new_context()
        urls = _recorded(ctx)
        page = ctx.new_page()
        problems = []
        page.on("console", lambda m: m.type == "error" and problems.append(m.text))
        page.goto(srv.url + "/")
        wait_js(page, "!document.getElementById('play').disabled")
        play_and_wait(page)
        page.goto(srv.url + "/docs")
        routes = wait_js(page, "window.qttsDocs && (window.qttsDocs.routes || window.qttsDocs.error)")
        assert isinstance(routes, int) and routes >= 8, page.evaluate("window.qttsDocs")
        text = page.inner_text("#routes")
        assert "POST /v1/audio/speech" in text and "response_format" in text and "alloy" in text
        page.wait_for_load_state("networkidle")
        ctx.close()
        assert problems == []
        ours = [u for u in urls if u.startswith(srv.url + "/")]
        assert len(ours) >= 10 and {srv.url + "/docs", srv.url + "/openapi.json", srv.url + "/ui/docs.js"} <= set(ours)
        assert [u for u in urls if u not in ours and not u.startswith(("blob:", "data:"))] == []
        for gone in ("/redoc", "/docs/oauth2-redirect"):
            assert httpx.get(srv.url + gone).status_code == 404
    finally:
        srv.stop()


def test_serve_prints_a_page_address_a_browser_can_open():
    from qtts.cli.serve import page_url

    assert page_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/"
    assert page_url("0.0.0.0", 8080) == "http://127.0.0.1:8080/"
    assert page_url("::", 8000) == "http://[::1]:8000/" and page_url("::1", 9) == "http://[::1]:9/"


def test_page_highlights_words_as_they_play(browser, tiny_snapshot, tmp_path):
    """Word timestamps on: the page asks for SSE with timestamps, shows the words and, as the player's
    clock advances, highlights the word being played (the last one started), in order. The tiny
    random aligner's classes are shrunk to 0.19 ms so its (arbitrary) times fall inside each 0.96 s
    piece instead of at its end; the DOM is read at points of the playback clock."""
    aligner = tmp_path / "aligner"
    shutil.copytree(tiny_aligner(tmp_path), aligner)
    config = json.loads((aligner / "config.json").read_text())
    config["timestamp_segment_time"] = PIECE_FRAMES / 12.5 * 1000 / 5000
    (aligner / "config.json").write_text(json.dumps(config))
    tts = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1, aligner=str(aligner))
    srv, _ = start_server(ShortPieces(tts), max_frames=64)
    try:
        ctx, page, problems = open_page(browser, srv.url)
        wait_js(page, "!document.getElementById('play').disabled")
        assert page.inner_text("#timestamps-note") == "(per word)" and not page.is_visible("#words")
        page.check("#timestamps")
        page.select_option("#voice", "vivian")
        page.fill("#text", TEXT)
        page.click("#play")
        points = _playback_points(page, lambda: screenshot(page, tmp_path, "web-page-words.png"))
        wait_js(page, "!document.querySelector('#words .word.now')", timeout=10)  # cleared once the audio has played
        last = page.evaluate("({...window.qtts.last, player: null})")
        assert last["error"] is None and last["done"] and last["samples"] == 4 * PIECE_FRAMES * 1920
        words = last["words"]
        assert [w["text"] for w in words] == split_words(TEXT, "English") and {w["unit"] for w in words} == {"word"}
        assert page.eval_on_selector_all("#words .word", "els => els.map(e => e.textContent)") == [
            w["text"] for w in words]
        starts = [w["start"] for w in words]

        def following(i: int, known: int) -> float:  # when the word after i starts, as far as the page knew
            return starts[i + 1] if i + 1 < known else float("inf")

        # every highlight change: the last word started at that clock reading (of those known), in order
        shown = [h for h in last["highlights"] if h["index"] >= 0]
        for h in shown:
            assert starts[h["index"]] <= h["t"] < following(h["index"], h["known"]), (h, words[h["index"]])
        indices = [h["index"] for h in shown]
        assert indices == sorted(set(indices)) and len(indices) >= 3, (indices, words)
        # the DOM at points of the clock: the highlighted span is the word being played (one frame late at most)
        lit = [p for p in points if p["index"] >= 0]
        assert len(lit) >= 3 and [p["index"] for p in lit] == sorted(p["index"] for p in lit)
        for p in lit:
            i = p["index"]
            assert p["text"] == words[i]["text"] and starts[i] - 0.1 <= p["t"] < following(i, p["known"]) + 0.1, (p, words[i])
        assert problems == []
        ctx.close()
    finally:
        srv.stop()


def _playback_points(page, snap) -> list[dict]:
    """Read the player's clock and the highlighted word every ~30 ms until the audio has played
    (``snap()`` once, while a word is lit past the middle of the audio)."""
    probe = """(() => {
        const l = window.qtts.last, el = document.querySelector('#words .word.now');
        if (!l || !l.player) return null;
        return {t: l.player.position(), queued: l.player.queued, done: l.done, error: l.error, known: l.known,
                index: el ? Number(el.dataset.i) : -1, text: el ? el.textContent : null};
    })()"""
    points, deadline = [], time.monotonic() + 90
    while time.monotonic() < deadline:
        p = page.evaluate(probe)
        if p is not None:
            points.append(p)
            if snap is not None and p["index"] >= 0 and p["t"] > 2:
                snap, _ = None, snap()
            if p["error"] or (p["done"] and p["t"] >= p["queued"] - 1e-3):
                return points
        time.sleep(0.03)
    raise AssertionError(f"the audio did not finish playing: {points[-3:]}")
