"""``agentstate serve``: LangGraph's server API (what ``langgraph_sdk`` and ``RemoteGraph`` speak) on a fleet
of GraphWorkers over plain Redis (the ``serve`` extra: Starlette and uvicorn).

::

    from redis_agentstate.server import create_app
    client = redis.asyncio.Redis.from_url(url, max_connections=320)  # the open streams and the workers
    app = create_app({"agent": graph}, client, token="s3cret")

See ``docs/serve.md`` for the routes served, the ones that are not, and the security rules.
"""

from __future__ import annotations

from ._app import NOT_SERVED, create_app
from ._served import RunOptions, ServedGraph

__all__ = ["NOT_SERVED", "RunOptions", "ServedGraph", "create_app"]
