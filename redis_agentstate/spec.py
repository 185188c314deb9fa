"""``StoreSpec``: a serialisable description of where state lives, as the seed's ``StateStoreSpec``.

A spec is what a deployment writes in its config file::

    {"kind": "redis", "location": "rediss://user:pw@host:6380/0", "namespace": "prod", "cluster": false}

and ``StoreSpec.from_dict(d).build()`` gives a ready ``CheckpointStore``.
``redis://``, ``rediss://`` (TLS) and ``unix://`` locations are accepted, and
``redis+sentinel://`` for a Sentinel-managed primary (see :func:`parse_sentinel_url`);
schemes in any case (RFC 3986). A location redis-py would refuse (or silently misread: a db that
is not a number, port 0) is ``InvalidArgument`` when the spec is made, not at ``build()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import isfinite
from typing import Any, cast
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis.connection

from .checkpoint import AsyncCheckpointStore, CheckpointStore
from .errors import InvalidArgument
from .keys import validate_namespace

__all__ = ["SCHEMES", "SentinelURL", "StoreSpec", "parse_sentinel_url"]

SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
KINDS = ("redis",)
#: Query options of a ``redis+sentinel://`` URL, with their types.
_SENTINEL_OPTIONS: dict[str, type] = {
    "sentinel_username": str,
    "sentinel_password": str,
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "min_other_sentinels": int,
}
#: Redis numbers its databases with a C int (SELECT, the ``databases`` setting).
MAX_DB = 2**31 - 1


def _split(url: str, what: str) -> SplitResult:
    """``urlsplit(url)``, its ValueError (``[::1`` without its ``]``) an ``InvalidArgument``."""
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise InvalidArgument(f"bad {what} {redact(url)!r}: {exc}") from exc


def _lower_scheme(url: str) -> str:
    """``url`` with its scheme in lower case, as redis-py (which compares it as given) needs it."""
    scheme, colon, rest = url.partition(":")
    return scheme.lower() + colon + rest if colon else url


def _number(text: str, what: str, low: int, high: int, url: str) -> int:
    """``text`` as an int in ``[low, high]``: ASCII digits only (``int`` reads ``'٣'`` and ``' 3'`` too)."""
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise InvalidArgument(f"{what} must be a number from {low} to {high}, got {text!r} in {redact(url)!r}")
    return int(text)


def _host_and_port(hostport: str, url: str) -> tuple[str, str]:
    """``(host, port text)`` of ``host[:port]`` or ``[ipv6][:port]`` (port text '' when absent)."""
    if hostport.startswith("["):
        host, bracket, rest = hostport[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidArgument(f"bad address {hostport!r} in {redact(url)!r}")
        return host, rest[1:]
    host, _, port = hostport.partition(":")
    return host, port


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL says: where the sentinels are and which primary to ask them for."""

    sentinels: list[tuple[str, int]]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelURL:
    """Read ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?options]``.

    The hosts are the sentinels (port 26379 when omitted); ``service_name`` is
    the primary's name in their configuration; the user and password are the
    primary's (``sentinel_username``/``sentinel_password`` in the query are the
    sentinels' own); ``socket_timeout``, ``socket_connect_timeout`` and
    ``min_other_sentinels`` are passed on. Anything else is ``InvalidArgument``.
    """
    if not isinstance(url, str):
        raise InvalidArgument(f"a Sentinel URL is a str, got {type(url).__name__}")
    parts = _split(url, "Sentinel URL")
    if parts.scheme != SENTINEL_SCHEME:
        raise InvalidArgument(f"a Sentinel URL starts with {SENTINEL_SCHEME}://, got {redact(url)!r}")
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    sentinels: list[tuple[str, int]] = []
    for hostport in hostlist.split(","):
        host, port = _host_port(hostport, url)
        sentinels.append((host, port))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise InvalidArgument(f"a Sentinel URL names the primary as /service_name[/db], got {redact(url)!r}")
    db = _number(path[1], "the db of a Sentinel URL", 0, MAX_DB, url) if len(path) == 2 else 0
    options: dict[str, Any] = {}
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        kind = _SENTINEL_OPTIONS.get(name)
        if kind is None:
            raise InvalidArgument(f"unknown Sentinel URL option {name!r} (known: {sorted(_SENTINEL_OPTIONS)})")
        options[name] = _option(name, kind, raw, url)
    return SentinelURL(sentinels, path[0], db, username, password, options)


def _option(name: str, kind: type, raw: str, url: str) -> Any:
    if kind is int:
        return _number(raw, f"Sentinel URL option {name}", 0, 1_000, url)
    if kind is float:
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not (isfinite(value) and value > 0):
            raise InvalidArgument(f"Sentinel URL option {name} must be a number of seconds above 0, got {raw!r}")
        return value
    return raw


def _host_port(hostport: str, url: str) -> tuple[str, int]:
    host, port = _host_and_port(hostport, url)
    if not host:
        raise InvalidArgument(f"bad sentinel address {hostport!r} in {redact(url)!r}")
    return host, _number(port, "a sentinel's port", 1, 65535, url) if port else 26379


def _check_redis_url(url: str, scheme: str, cluster: bool) -> None:
    """Refuse a ``redis://``/``rediss://``/``unix://`` location redis-py would refuse at ``build()``,
    or read other than it says (a db path that is not a number is ignored, port 0 means 6379)."""
    parts = _split(url, "location")
    if scheme == "unix":
        if not unquote(parts.path):
            raise InvalidArgument(f"a unix:// location names the socket's path (unix:///path), got {redact(url)!r}")
    else:
        _, port = _host_and_port(parts.netloc.rpartition("@")[2], url)
        if port:
            _number(port, "the port", 1, 65535, url)
        db = unquote(parts.path).strip("/")
        if db:
            _number(db, "the db (the location's path)", 0, MAX_DB, url)
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        if name == "db":
            _number(raw, "the db option", 0, MAX_DB, url)
    try:
        kwargs = redis.connection.parse_url(_lower_scheme(url))  # type: ignore[no-untyped-call]  # its option types (socket_timeout=soon, ...)
    except ValueError as exc:
        raise InvalidArgument(f"bad location {redact(url)!r}: {exc}") from exc
    if cluster and kwargs.get("db", 0) != 0:
        raise InvalidArgument(f"a Redis Cluster has only db 0, got db {kwargs['db']} in {redact(url)!r}")


def _sentinel_kwargs(parsed: SentinelURL, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], int]:
    """``(Sentinel(...) keywords, master_for keywords, min_other_sentinels)`` for ``parsed``."""
    options = dict(parsed.options)
    min_other = options.pop("min_other_sentinels", 0)
    sentinel_kwargs = {k.removeprefix("sentinel_"): options.pop(k) for k in list(options) if k.startswith("sentinel_")}
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in options:
            sentinel_kwargs.setdefault(name, options[name])
    master = {**options, **kwargs, "db": parsed.db, "username": parsed.username, "password": parsed.password}
    return sentinel_kwargs, master, min_other


def _secret(option: str) -> bool:
    return option.lower().endswith("password")


def redact(location: str) -> str:
    """``location`` with any password (``user:pw@``, ``?password=``, ``?sentinel_password=``) replaced by ``***``.

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
            if any(_secret(k) for k, _ in pairs):
                query = urlencode([(k, "***" if _secret(k) else v) for k, v in pairs], safe="*")
        shown = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
        if not netloc and location[len(parts.scheme) + 1 :].startswith("//"):
            shown = f"{parts.scheme}://{shown[len(parts.scheme) + 1 :]}"  # unix:///path, not unix:/path
        return shown
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
        if any(c.isspace() or not c.isprintable() for c in self.location):
            raise InvalidArgument(
                "state_store.location must not hold spaces or control characters (percent-encode them), "
                f"got {redact(self.location)!r}"
            )
        scheme = _split(self.location, "state_store.location").scheme
        if scheme not in SCHEMES:
            raise InvalidArgument(
                "state_store.location must be a redis://, rediss://, unix:// or redis+sentinel:// URL, "
                f"got {redact(self.location)!r}"
            )
        if self.cluster and scheme in ("unix", SENTINEL_SCHEME):
            raise InvalidArgument(f"a Redis Cluster cannot be reached through a {scheme}:// location")
        if not isinstance(self.cluster, bool):
            raise InvalidArgument("state_store.cluster must be a bool")
        # A bad location is refused now, not at first use.
        if scheme == SENTINEL_SCHEME:
            parse_sentinel_url(self.location)
        else:
            _check_redis_url(self.location, scheme, self.cluster)
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

    @property
    def _sentinel(self) -> bool:
        return urlsplit(self.location).scheme == SENTINEL_SCHEME

    def client(self, **kwargs: Any) -> Any:
        """A sync redis-py client for the location (``decode_responses`` is forced off).

        For ``redis+sentinel://`` it is ``Sentinel(...).master_for(service_name)``:
        each connection asks the sentinels where the primary is, so the store
        follows a failover (writes in flight at a failover may be lost: see
        :ref:`durability <failover>`).
        """
        kwargs["decode_responses"] = False
        if self._sentinel:
            from redis.sentinel import Sentinel

            parsed = parse_sentinel_url(self.location)
            sentinel_kwargs, master, min_other = _sentinel_kwargs(parsed, kwargs)
            # Any: redis-py 8.2 types Sentinel, earlier versions do not (no ignore fits both).
            sentinel: Any = cast(Any, Sentinel)(
                parsed.sentinels, min_other_sentinels=min_other, sentinel_kwargs=sentinel_kwargs
            )
            return sentinel.master_for(parsed.service_name, **master)
        if self.cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(_lower_scheme(self.location), **kwargs)
        return redis.Redis.from_url(_lower_scheme(self.location), **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        """An asyncio redis-py client for the location."""
        kwargs["decode_responses"] = False
        if self._sentinel:
            from redis.asyncio.sentinel import Sentinel as AsyncSentinel

            parsed = parse_sentinel_url(self.location)
            sentinel_kwargs, master, min_other = _sentinel_kwargs(parsed, kwargs)
            sentinel: Any = cast(Any, AsyncSentinel)(
                parsed.sentinels, min_other_sentinels=min_other, sentinel_kwargs=sentinel_kwargs
            )
            return sentinel.master_for(parsed.service_name, **master)
        if self.cluster:
            from redis.asyncio.cluster import RedisCluster

            return RedisCluster.from_url(_lower_scheme(self.location), **kwargs)
        import redis.asyncio

        return redis.asyncio.Redis.from_url(_lower_scheme(self.location), **kwargs)

    def build(self, **store_kwargs: Any) -> CheckpointStore:
        """A ``CheckpointStore`` on a new client (connects on first use); keywords go to the store."""
        return CheckpointStore(self.client(), self.namespace, **store_kwargs)

    def build_async(self, **store_kwargs: Any) -> AsyncCheckpointStore:
        """The asyncio twin of ``build``: an ``AsyncCheckpointStore`` on a new ``redis.asyncio`` client."""
        return AsyncCheckpointStore(self.async_client(), self.namespace, **store_kwargs)
