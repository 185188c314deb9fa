"""``StoreSpec``: a serialisable description of where state lives, as the seed's ``StateStoreSpec``.

A spec is what a deployment writes in its config file::

    {"kind": "redis", "location": "rediss://user:pw@host:6380/0", "namespace": "prod", "cluster": false}

and ``StoreSpec.from_dict(d).build()`` gives a ready ``CheckpointStore``.
``redis://``, ``rediss://`` (TLS) and ``unix://`` locations are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .checkpoint import AsyncCheckpointStore, CheckpointStore
from .errors import InvalidArgument
from .keys import validate_namespace

__all__ = ["SCHEMES", "StoreSpec"]

SCHEMES = ("redis", "rediss", "unix")
KINDS = ("redis",)


def redact(location: str) -> str:
    """``location`` with any password (``user:pw@`` or ``?password=``) replaced by ``***``.

    A spec ends up in logs and tracebacks through its repr; the password must not.
    """
    try:
        parts = urlsplit(location)
        netloc = parts.netloc
        userinfo, at, hostport = netloc.rpartition("@")
        if at and ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(k.lower() == "password" for k, _ in pairs):
                query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # not a URL we can take apart: show nothing of it
        return "<unparseable location>"


@dataclass(frozen=True)
class StoreSpec:
    """Kind, location URL, namespace and topology of a store."""

    kind: str
    location: str
    namespace: str = "agentstate"
    cluster: bool = False

    def __repr__(self) -> str:
        return (
            f"StoreSpec(kind={self.kind!r}, location={redact(self.location)!r}, "
            f"namespace={self.namespace!r}, cluster={self.cluster!r})"
        )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgument(f"state_store.kind must be 'redis', got {self.kind!r}")
        if not isinstance(self.location, str) or not self.location.strip():
            raise InvalidArgument("state_store.location must be a non-empty string")
        scheme = urlsplit(self.location).scheme
        if scheme not in SCHEMES:
            raise InvalidArgument(
                f"state_store.location must be a redis://, rediss:// or unix:// URL, got {redact(self.location)!r}"
            )
        if self.cluster and scheme == "unix":
            raise InvalidArgument("a Redis Cluster cannot be reached over a unix:// socket")
        if not isinstance(self.cluster, bool):
            raise InvalidArgument("state_store.cluster must be a bool")
        validate_namespace(self.namespace)

    @classmethod
    def redis(cls, location: str, *, namespace: str = "agentstate", cluster: bool = False) -> StoreSpec:
        """A ``kind="redis"`` spec."""
        return cls("redis", location, namespace, cluster)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a config-file object (``from_dict`` reads it back)."""
        return {"kind": self.kind, "location": self.location, "namespace": self.namespace, "cluster": self.cluster}

    @classmethod
    def from_dict(cls, payload: object) -> StoreSpec:
        """Read a config-file object; ``InvalidArgument`` names what is wrong, unknown fields included."""
        if not isinstance(payload, dict):
            raise InvalidArgument("state_store must be an object")
        kind = payload.get("kind")
        if kind not in KINDS:
            raise InvalidArgument(f"state_store.kind must be 'redis', got {kind!r}")
        location = payload.get("location")
        if not isinstance(location, str) or not location.strip():
            raise InvalidArgument("state_store.location must be a non-empty string")
        unknown = set(payload) - {"kind", "location", "namespace", "cluster"}
        if unknown:
            raise InvalidArgument(f"state_store has unknown fields: {sorted(unknown)}")
        return cls(kind, location, payload.get("namespace", "agentstate"), payload.get("cluster", False))

    def client(self, **kwargs: Any) -> Any:
        """A sync redis-py client for the location (``decode_responses`` is forced off)."""
        kwargs["decode_responses"] = False
        if self.cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(self.location, **kwargs)
        import redis

        return redis.Redis.from_url(self.location, **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        """An asyncio redis-py client for the location."""
        kwargs["decode_responses"] = False
        if self.cluster:
            from redis.asyncio.cluster import RedisCluster

            return RedisCluster.from_url(self.location, **kwargs)
        import redis.asyncio

        return redis.asyncio.Redis.from_url(self.location, **kwargs)

    def build(self, **store_kwargs: Any) -> CheckpointStore:
        """A ``CheckpointStore`` on a new client (connects on first use); keywords go to the store."""
        return CheckpointStore(self.client(), self.namespace, **store_kwargs)

    def build_async(self, **store_kwargs: Any) -> AsyncCheckpointStore:
        """The asyncio twin of ``build``: an ``AsyncCheckpointStore`` on a new ``redis.asyncio`` client."""
        return AsyncCheckpointStore(self.async_client(), self.namespace, **store_kwargs)
