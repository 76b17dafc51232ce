"""The web page at ``/``: type text, pick a voice, hear it while it is generated.

Plain HTML, CSS and JavaScript shipped in ``qtts/server/static/`` (no build step, nothing from
a CDN). The page uses the public API only: ``GET /v1/voices``, ``POST /v1/voices`` (uploads) and
``POST /v1/audio/speech`` with ``response_format: "pcm"``, whose body it reads as a stream and
schedules into WebAudio as it arrives; with "word timestamps" it asks for SSE with ``timestamps:
true`` and highlights the word being played (``words.js``). ``GET /ui/info`` tells it what the
served model takes (and whether its timestamps are per word or per text piece).

``/docs`` is the API reference: ``/openapi.json`` rendered by ``docs.js`` from the same folder
(FastAPI's Swagger UI and ReDoc pages load their scripts from a CDN, so the app turns them off:
offline they are blank, and opening them would make the browser contact another host).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..config import SAMPLE_RATE
from ..options import MAX_SPEED, MIN_SPEED
from .voices import engine_languages, engine_speakers

router = APIRouter()

#: the page talks to its own origin only; audio plays from WebAudio buffers and blob: URLs
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; media-src 'self' blob:; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "words.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
    "docs.html": "text/html; charset=utf-8",
    "docs.js": "text/javascript; charset=utf-8",
}


def asset(name: str) -> bytes:
    """A file of the page (read from the installed package)."""
    return (resources.files("qtts.server") / "static" / name).read_bytes()


def _serve(name: str) -> Response:
    return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)


#: the page's URLs and the file each one serves (GET, outside the API schema)
ROUTES = {"/": "index.html", "/ui/app.js": "app.js", "/ui/words.js": "words.js", "/ui/style.css": "style.css",
          "/ui/icon.svg": "icon.svg", "/docs": "docs.html", "/ui/docs.js": "docs.js"}  # fmt: skip


def _route(name: str):
    async def serve() -> Response:
        return _serve(name)

    serve.__name__ = "page_" + name.replace(".", "_")
    return serve


for _path, _name in ROUTES.items():
    router.add_api_route(_path, _route(_name), methods=["GET"], include_in_schema=False)


def takes_instruct(model_type: str, model_size: str) -> bool:
    """VoiceDesign needs an instruction; the 1.7B CustomVoice takes one (see qtts.text.prompt)."""
    return model_type == "voice_design" or (model_type == "custom_voice" and model_size == "1b7")


@router.get("/ui/info", include_in_schema=False)
async def page_info(request: Request) -> dict:
    """What the page shows: model, speakers, languages, whether uploads and instructions apply."""
    state = request.app.state.qtts
    state.require_ready()
    engine = state.engine
    model_type = str(getattr(engine, "model_type", ""))
    model_size = str(getattr(engine, "model_size", ""))
    return {
        "model": state.settings.model_id, "model_type": model_type, "model_size": model_size,
        "speakers": engine_speakers(engine), "languages": engine_languages(engine),
        "cloning": model_type == "base", "uploads": state.store.enabled,
        "instruct": takes_instruct(model_type, model_size), "instruct_required": model_type == "voice_design",
        "max_input_chars": state.settings.max_input_chars, "speed": [MIN_SPEED, MAX_SPEED],
        "sample_rate": SAMPLE_RATE, "timestamps": state.timestamps,
    }  # fmt: skip
