"""The LangGraph integration's scripts, plugged into the core's loader (``wire/scripts.py``).

One file per operation in this package's ``lua/`` folder, built as the core's are: the rendered
constants, then the preludes each one lists below (the core's ``_base``, ``_moved`` and
``_common``, then this family's ``_lg``, ``_lgrun`` or ``_lgs``), then its own file. Importing this
module registers the family (``register_family``): its names join ``WRITES`` or ``READS``, and
its writes' replies say what telemetry counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..wire.scripts import Reply, ScriptFamily, register_family

__all__ = [
    "CRON_ADVANCE",
    "CRON_DELETE",
    "CRON_PUT",
    "CRON_SCRIPTS",
    "LGS_ASSIGN",
    "LGS_COUNT",
    "LGS_PROBE",
    "LGS_TRAIN",
    "LGS_GET",
    "LGS_INDEX",
    "LGS_NAMESPACES",
    "LGS_PREFIX",
    "LGS_PICK",
    "LGS_PUT",
    "LGS_SCAN",
    "LGS_SCRIPTS",
    "LGS_SEARCH",
    "LG_DELETE_RUNS",
    "LG_DELETE_THREAD",
    "LG_DUMP",
    "LG_GET",
    "LG_IMPORT",
    "LG_LEASE",
    "LG_LIST",
    "LG_PRUNE",
    "LG_PUT",
    "LG_PUT_WRITES",
    "LG_RELEASE",
    "LG_RENEW",
    "LG_RUN_BEGIN",
    "LG_RUN_CANCEL",
    "LG_RUN_CREATE",
    "LG_RUN_DELETE",
    "LG_RUN_EMIT",
    "LG_RUN_FINISH",
    "LG_RUN_INDEX",
    "LG_RUN_SCRIPTS",
    "LG_RUN_WAKE",
    "LG_SCRIPTS",
    "LANGGRAPH_SCRIPTS",
]

#: The saver's scripts (``AgentStateSaver``): each takes one thread's keys (``keys.ThreadKeys``).
LG_PUT = "lg_put"
LG_PUT_WRITES = "lg_put_writes"
LG_GET = "lg_get"
LG_LIST = "lg_list"
LG_DELETE_THREAD = "lg_delete_thread"
LG_DELETE_RUNS = "lg_delete_runs"
LG_PRUNE = "lg_prune"
LG_DUMP = "lg_dump"
LG_IMPORT = "lg_import"
LG_LEASE = "lg_lease"
LG_RENEW = "lg_renew"
LG_RELEASE = "lg_release"
LG_SCRIPTS = (
    LG_PUT, LG_PUT_WRITES, LG_GET, LG_LIST, LG_DELETE_THREAD, LG_DELETE_RUNS, LG_PRUNE,
    LG_DUMP, LG_IMPORT, LG_LEASE, LG_RENEW, LG_RELEASE,
)  # fmt: skip

#: The LangGraph run queue's scripts (``redis_agentstate.langgraph.RunQueue``): each takes one
#: thread's run keys (``keys.RunKeys``), and create and wake the thread's task keys before them.
LG_RUN_CREATE = "lg_run_create"
LG_RUN_BEGIN = "lg_run_begin"
LG_RUN_EMIT = "lg_run_emit"
LG_RUN_FINISH = "lg_run_finish"
LG_RUN_CANCEL = "lg_run_cancel"
LG_RUN_WAKE = "lg_run_wake"
LG_RUN_INDEX = "lg_run_index"
LG_RUN_DELETE = "lg_run_delete"
LG_RUN_SCRIPTS = (
    LG_RUN_CREATE, LG_RUN_BEGIN, LG_RUN_EMIT, LG_RUN_FINISH, LG_RUN_CANCEL, LG_RUN_WAKE, LG_RUN_INDEX, LG_RUN_DELETE,
)  # fmt: skip

#: The LangGraph store's scripts (``redis_agentstate.langgraph.AgentStateStore``): each takes one
#: store namespace's keys and its shard's indexes (``keys.StoreKeys``), lgs_namespaces and lgs_index a
#: shard's indexes.
LGS_PUT = "lgs_put"
LGS_GET = "lgs_get"
LGS_SEARCH = "lgs_search"
LGS_PREFIX = "lgs_prefix"
LGS_NAMESPACES = "lgs_namespaces"
LGS_INDEX = "lgs_index"
LGS_COUNT = "lgs_count"
LGS_PROBE = "lgs_probe"
LGS_TRAIN = "lgs_train"
LGS_ASSIGN = "lgs_assign"
LGS_SCAN = "lgs_scan"
LGS_PICK = "lgs_pick"
LGS_SCRIPTS = (
    LGS_PUT, LGS_GET, LGS_SEARCH, LGS_PREFIX, LGS_NAMESPACES, LGS_INDEX, LGS_COUNT, LGS_PROBE, LGS_TRAIN, LGS_ASSIGN,
    LGS_SCAN, LGS_PICK,
)  # fmt: skip

#: The cron schedules of ``agentstate serve`` (``crons.py``), in one slot per namespace.
CRON_PUT = "cron_put"
CRON_ADVANCE = "cron_advance"
CRON_DELETE = "cron_delete"
CRON_SCRIPTS = (CRON_PUT, CRON_ADVANCE, CRON_DELETE)


def _lg_write_events(reply: Any) -> Sequence[str]:
    # REFUSED 'busy' / 'lost': the thread's lease refused it; 'base' is a missing parent, not the fence.
    if isinstance(reply, (list, tuple)) and reply and reply[0] == Reply.REFUSED and len(reply) > 1:
        return ("fenced_writes",) if reply[1] in (b"busy", b"lost", "busy", "lost") else ()
    return ()


# lgs_get and lgs_pick write: a read with refresh_on_read moves the item's expiry.
_WRITES = frozenset({
    LG_PUT, LG_PUT_WRITES, LG_DELETE_THREAD, LG_DELETE_RUNS, LG_PRUNE, LG_IMPORT, LG_LEASE, LG_RENEW, LG_RELEASE,
    *LG_RUN_SCRIPTS, LGS_PUT, LGS_GET, LGS_PICK, LGS_INDEX, LGS_TRAIN, LGS_ASSIGN, *CRON_SCRIPTS,
})  # fmt: skip

#: The family as the loader takes it.
LANGGRAPH_SCRIPTS = ScriptFamily(
    package=__package__ or "redis_agentstate.langgraph",
    preludes={
        **{name: ("_base", "_moved", "_lg") for name in LG_SCRIPTS},
        **{name: ("_base", "_moved", "_common", "_lgrun") for name in LG_RUN_SCRIPTS},
        **{name: ("_base", "_moved", "_lgs") for name in LGS_SCRIPTS},
        **{name: ("_base", "_moved") for name in CRON_SCRIPTS},
    },
    writes=_WRITES,
    events={LG_PUT: _lg_write_events, LG_PUT_WRITES: _lg_write_events},
)
register_family(LANGGRAPH_SCRIPTS)
