"""Connection pools of the clients of tandem's generation servers.

A server (uvicorn) closes a keep-alive connection that has been idle for
``SERVER_KEEP_ALIVE_S``. A client that reuses such a connection just as the server closes
it sends its request into a closed socket and reads a reset (``httpx.ReadError``), which
once stopped a 300-step run (docs/reliability.md). So every client pool here drops its
idle connections long before the server would.
"""

from __future__ import annotations

import httpx

SERVER_KEEP_ALIVE_S = 5.0  # uvicorn's timeout_keep_alive on tandem's servers (its default)
POOL_LIMITS = httpx.Limits(
    max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=SERVER_KEEP_ALIVE_S / 5
)
