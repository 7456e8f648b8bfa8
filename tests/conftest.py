"""How the suite is spread over pytest-xdist's workers (``deploy/test.sh`` runs it with ``-n 2 --dist loadgroup``).

The integration tests spend most of their time waiting on the wall clock (the machine is 10-30% busy while they
run), so they run in two queues beside each other, one test at a time in each: those that bring their own brokers
or servers (and stop, kill or restart only those: tests/integration/own_services.py), and the rest, which share
the session's broker and clickhouse-server. The unit tests and doctests fill in on whichever worker is free.

xdist's own ``loadgroup`` renames each grouped test's node id to carry its group, which pytest 9 no longer lets a
plugin do (the id lives in ``Node._id``): the groups would be ignored. So the grouping is a scheduler of ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from xdist.scheduler import LoadScopeScheduling

INTEGRATION = "tests/integration/"
# The slow tests whose faults hit services of their own, and the rest of their queue: about 500 s of the 1,670.
# The rebalance storm (three workers, 135 s) runs here too, on the session's services: beside the ClickHouse
# outage test, the two heaviest tests starved a publisher and both saw late samples (one full run of two).
OWN_SERVICES = tuple(INTEGRATION + t for t in (
    "test_clickhouse_outage.py", "test_bursts.py::test_a_broker_restart", "test_kafka_cluster.py",
    "test_kafka_secure.py", "test_cluster.py", "test_chdb_merge_kill.py", "test_rebalance_storm.py"))


def scope_of(nodeid: str) -> str:
    """The queue a test belongs to: one of the two of the integration tests, or its own (any other test).

    >>> scope_of("tests/integration/test_crash.py::test_sigkill_mid_run[chdb-0]")
    'shared-services'
    >>> scope_of("tests/integration/test_kafka_cluster.py::test_two_broker_kills_mid_run")
    'own-services'
    >>> scope_of("tests/unit/test_align.py::test_late")
    'tests/unit/test_align.py::test_late'
    """
    if nodeid.startswith(OWN_SERVICES):
        return "own-services"
    return "shared-services" if nodeid.startswith(INTEGRATION) else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationQueues(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return IntegrationQueues(config, log)
