"""How the suite is spread over pytest-xdist's workers (``deploy/test.sh`` runs it with ``-n 2 --dist loadgroup``).

Every integration test runs on one worker, one after another: they share the session's broker and
clickhouse-server, and some stop or restart them. Most of their time is spent waiting on the wall clock (the
machine is 10-30% busy while they run), so the unit tests and doctests run on the other worker beside them.

xdist's own ``loadgroup`` renames each grouped test's node id to carry its group, which pytest 9 no longer lets a
plugin do (the id lives in ``Node._id``): the groups would be ignored. So the grouping is a scheduler of ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from xdist.scheduler import LoadScopeScheduling

SERVICES = "tests/integration/"


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: the integration tests are one, every other test its own.

    >>> scope_of("tests/integration/test_crash.py::test_sigkill_mid_run[chdb-0]")
    'services'
    >>> scope_of("tests/unit/test_align.py::test_late")
    'tests/unit/test_align.py::test_late'
    """
    return "services" if nodeid.startswith(SERVICES) else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ServicesTogether(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ServicesTogether(config, log)
