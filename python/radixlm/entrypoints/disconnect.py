"""Noticing that an HTTP client went away while its (non-streaming) request runs."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable

from fastapi import Request


class ClientDisconnected(Exception):
    pass


async def wait_disconnect(request: Request) -> None:
    """Returns when the client has gone. The body has been read already, so the next ASGI
    message can only be http.disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`; if the client disconnects first, cancel it (cancelling an engine call
    aborts its requests) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise ClientDisconnected()
        return task.result()
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
