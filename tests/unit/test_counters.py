"""The one stats base: each service's JSON summary is its counters' fields, in order, as plain values."""

from __future__ import annotations

import doctest
from collections import Counter

import orjson

import schemas.counters
from agents.act.consumer import ActStats
from agents.collect.replay import FileSummary
from agents.collect.simulator import PublishStats
from agents.ingest.stats import IngestStats


def test_doctests_pass() -> None:
    result = doctest.testmod(schemas.counters, report=True)
    assert result.attempted >= 1 and result.failed == 0


def test_a_summary_is_the_fields_in_order_with_plain_mappings() -> None:
    st = ActStats(messages=3, acted=1, bad_reasons={"malformed_json": 2})
    d = st.as_dict()
    assert list(d) == ["messages", "acted", "already_done", "bad", "stale", "refused", "failed", "commits", "purged",
                       "bad_reasons"]
    assert d["bad_reasons"] == {"malformed_json": 2} and d["bad_reasons"] is not st.bad_reasons
    assert PublishStats(messages=2, samples=5).as_dict() == {"messages": 2, "samples": 5, "events": 0, "bad": 0}
    f = FileSummary("a.csv", "csv", "n1", skipped_cells=Counter({"power": 1}))
    assert type(f.as_dict()["skipped_cells"]) is dict
    assert orjson.loads(orjson.dumps(f.as_dict()))["skipped_cells"] == {"power": 1}


def test_the_ingest_summary_leaves_out_its_clock_and_an_empty_detect() -> None:
    st = IngestStats(samples=4, rejects=Counter({"late": 1}))
    d = st.as_dict()
    assert "first_record_ns" not in d and "first_record_cpu_s" not in d and "detect" not in d
    assert d["rejects"] == {"late": 1}
    assert list(d)[-1] == "late"
    st.detect = {"frames": 2}
    assert list(st.as_dict())[-1] == "detect" and st.as_dict()["detect"] == {"frames": 2}
