"""A streaming response that always stops its generation job when the response ends."""

from __future__ import annotations

import anyio
from starlette.responses import StreamingResponse

from .worker import Job

#: after the response ends, wait this long for the worker to stop (so logs and metrics are final)
STOP_WAIT_S = 30.0


class JobStreamingResponse(StreamingResponse):
    """StreamingResponse bound to a :class:`Job`.

    Starlette cancels the body iterator when the client disconnects; whatever way the response
    ends (complete, disconnect, send error, server shutdown), ``cancel()`` is called on the job in
    ``finally``, so the worker stops at its next chunk boundary and frees its slot.
    """

    def __init__(self, job: Job, content, **kwargs):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self.job.wait_done(STOP_WAIT_S)
