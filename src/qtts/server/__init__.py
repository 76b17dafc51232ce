"""HTTP server (extra ``serve``): an OpenAI-compatible streaming speech API over :class:`qtts.TTS`.

``create_app(engine, settings)`` builds the FastAPI app (testable without a socket);
``qtts serve`` runs it under uvicorn. See docs/server.md.
"""

from __future__ import annotations

from .settings import SUPPORTED_FORMATS, ServerSettings

__all__ = ["ServerSettings", "SUPPORTED_FORMATS", "create_app"]


def create_app(engine=None, settings: ServerSettings | None = None):
    """See :func:`qtts.server.app.create_app` (imported lazily: FastAPI is an extra)."""
    from ..errors import require

    require("fastapi", "serve", "the HTTP server")
    from .app import create_app as _create_app

    return _create_app(engine, settings)
