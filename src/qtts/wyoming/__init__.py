"""Wyoming protocol server (extra ``wyoming``): qtts as a local TTS for Home Assistant.

``qtts wyoming --model M --uri tcp://127.0.0.1:10200`` answers ``describe`` with the voices and
languages of the checkpoint and streams ``synthesize`` (and ``synthesize-start`` / ``-chunk`` /
``-stop``) as audio events while it generates. In Python: ``WyomingService(tts, settings)``
with ``await service.start(uri)`` or ``await service.run()``. See docs/home-assistant.md.
"""

from __future__ import annotations

from .service import WyomingService, WyomingSettings

__all__ = ["WyomingService", "WyomingSettings"]
