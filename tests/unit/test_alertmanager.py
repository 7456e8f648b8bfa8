"""The forwarder's pure parts: Alertmanager payloads, which alerts to post when, retries; time is an argument."""

from __future__ import annotations

import dataclasses
import doctest

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agents.runtime.backoff
import agents.runtime.logs
import agents.sinks.alertmanager
from agents.runtime.backoff import Backoff
from agents.runtime.logs import redact
from agents.sinks.alertmanager import (
    AlertBook,
    ForwardParams,
    alert_labels,
    postable,
    refused_for_good,
    rfc3339,
)
from schemas.alerts import Alert, make_alert

S = 10**9
T0 = 1_796_200_000 * S
P = ForwardParams(resend_ns=10 * S, ends_after_ns=40 * S)


def firing(gpu: str = "0", onset_ns: int = T0, **changes: object) -> Alert:
    a = make_alert("util_spike", "warning", "node-07", gpu, value=99.5, threshold=95.0, baseline=40.0,
                   onset_ts_ns=onset_ns, ts_ns=onset_ns + S // 5, workload="llm", namespace="ml",
                   evidence={"window_ms": 1000, "above_ms": 200})
    return dataclasses.replace(a, **changes) if changes else a  # type: ignore[arg-type]


def states(alerts: list[Alert]) -> list[tuple[str, str]]:
    return [(a.gpu, a.state) for a in alerts]


def test_doctests_pass() -> None:
    result = doctest.testmod(agents.sinks.alertmanager, report=True)
    assert result.attempted >= 5 and result.failed == 0
    # The retry schedule and the URL redaction it uses live in the runtime now.
    for module in (agents.runtime.backoff, agents.runtime.logs):
        result = doctest.testmod(module, report=True)
        assert result.attempted >= 1 and result.failed == 0


# --- payloads -------------------------------------------------------------------------------------------------------

def test_a_firing_alert_becomes_an_alertmanager_alert() -> None:
    a = firing()
    body = postable(a, T0 + 5 * S, P)
    assert body["labels"] == {"alertname": "util_spike", "severity": "warning", "node": "node-07", "gpu": "0",
                              "alert_id": a.id, "workload": "llm", "namespace": "ml"}
    assert body["startsAt"] == rfc3339(T0) == "2026-12-02T08:26:40.000000000Z"
    assert body["endsAt"] == rfc3339(T0 + 45 * S)
    ann = body["annotations"]
    assert (ann["value"], ann["threshold"], ann["baseline"]) == ("99.5", "95.0", "40.0")
    assert orjson.loads(ann["evidence"]) == {"above_ms": 200, "window_ms": 1000}
    assert ann["message_id"] == f"{a.id}:firing"
    assert "util_spike on node-07 GPU 0: 99.5 against threshold 95" in ann["summary"]
    assert "generatorURL" not in body


def test_a_resolution_ends_at_the_resolved_time_whenever_it_is_sent() -> None:
    a = firing().resolved(T0 + 30 * S, value=50.0)
    for now in (T0 + 31 * S, T0 + 3600 * S):
        body = postable(a, now, P)
        assert (body["startsAt"], body["endsAt"]) == (rfc3339(T0), rfc3339(T0 + 30 * S))
        assert body["annotations"]["message_id"].endswith(":resolved")


def test_empty_labels_are_left_out_and_two_gpus_never_share_labels() -> None:
    a = firing(workload=None, namespace=None, baseline=None, evidence={})
    body = postable(a, T0, P)
    assert set(body["labels"]) == {"alertname", "severity", "node", "gpu", "alert_id"}
    assert "baseline" not in body["annotations"] and "evidence" not in body["annotations"]
    assert alert_labels(firing("0")) != alert_labels(firing("1"))
    assert alert_labels(firing("0")) != alert_labels(firing("0", onset_ns=T0 + S))  # another episode


def test_an_onset_ahead_of_the_clock_still_ends_after_it_starts() -> None:
    body = postable(firing(onset_ns=T0 + 100 * S), T0, P)
    assert body["endsAt"] > body["startsAt"]


def test_generator_url_template() -> None:
    p = dataclasses.replace(P, generator_url="https://grafana.example/d/gpu?var-node={node}&var-gpu={gpu}&a={id}")
    a = firing("GPU-1/2")
    assert postable(a, T0, p)["generatorURL"] == f"https://grafana.example/d/gpu?var-node=node-07&var-gpu=GPU-1%2F2&a={a.id}"
    with pytest.raises(ValueError, match="only"):
        dataclasses.replace(P, generator_url="http://x/{pod}")


def test_params() -> None:
    p = ForwardParams.from_seconds(60)
    assert (p.resend_ns, p.ends_after_ns) == (60 * S, 240 * S)
    assert ForwardParams.from_seconds(1, 3).ends_after_ns == 3 * S
    with pytest.raises(ValueError, match="ends-after > resend"):
        ForwardParams.from_seconds(10, 10)
    with pytest.raises(ValueError):
        ForwardParams.from_seconds(0)


def test_credentials_never_reach_the_logs() -> None:
    assert redact("https://am:pw@alerts.example/prefix") == "https://***@alerts.example/prefix"
    assert "pw" not in redact("http://u:pw@127.0.0.1:9094")
    assert refused_for_good(400) and refused_for_good(422)
    assert not any(refused_for_good(s) for s in (200, 408, 429, 500, 503))


# --- the book ---------------------------------------------------------------------------------------------------

def test_firing_alerts_are_posted_at_once_and_then_every_resend() -> None:
    book = AlertBook(P)
    assert book.add(firing("0"), 0, T0)
    assert book.add(firing("1"), 1, T0)
    due = book.due(T0)
    assert states(due) == [("0", "firing"), ("1", "firing")]
    book.sent(due, T0 + S)
    assert book.due(T0 + 10 * S) == []
    assert states(book.due(T0 + 11 * S)) == [("0", "firing"), ("1", "firing")]
    assert len(book.firing) == 2


def test_a_resolution_is_posted_once_and_the_episode_never_fires_again() -> None:
    book = AlertBook(P)
    a = firing()
    book.add(a, 0, T0)
    book.sent(book.due(T0), T0)
    book.add(a.resolved(T0 + 5 * S), 0, T0 + 5 * S)
    due = book.due(T0 + 5 * S)
    assert states(due) == [("0", "resolved")]
    book.sent(due, T0 + 5 * S)
    assert book.due(T0 + 10**6 * S) == [] and book.firing == [] and book.pending_resolutions == 0
    assert not book.add(a, 0, T0 + 6 * S)  # a detector's replay of the firing message
    assert not book.add(a.resolved(T0 + 5 * S), 0, T0 + 6 * S)
    assert book.due(T0 + 10**6 * S) == []


def test_a_failed_post_keeps_everything_due_until_it_is_accepted() -> None:
    book = AlertBook(P)
    a = firing()
    book.add(a, 0, T0)
    book.sent(book.due(T0), T0)
    book.add(a.resolved(T0 + 2 * S), 0, T0 + 2 * S)
    for hour in range(1, 48):  # Alertmanager down for two days: the resolution stays queued
        assert states(book.due(T0 + hour * 3600 * S)) == [("0", "resolved")]
        assert book.pending_resolutions == 1
    book.sent(book.due(T0 + 49 * 3600 * S), T0 + 49 * 3600 * S)
    assert book.pending_resolutions == 0


def test_rebuilding_from_the_topic_keeps_what_still_fires_and_old_resolutions_quiet() -> None:
    now = T0 + 7200 * S
    old, recent, still = firing("0"), firing("1", onset_ns=now - 100 * S), firing("2")
    book = AlertBook(P)  # a restarted forwarder reads the whole topic before posting anything
    for msg in (old, recent, still, old.resolved(T0 + 60 * S), recent.resolved(now - 50 * S)):
        book.add(msg, 0, now)
    # The old resolution's alert ended in Alertmanager long ago; the recent one may still be active there.
    assert states(book.due(now)) == [("1", "resolved"), ("2", "firing")]


def test_held_partitions_post_nothing_until_caught_up() -> None:
    book = AlertBook(P)
    book.add(firing("0"), 0, T0)
    book.add(firing("1"), 3, T0)
    assert states(book.due(T0, held={3})) == [("0", "firing")]
    assert states(book.due(T0, held={0, 3})) == []


def test_a_message_read_while_posting_is_not_lost() -> None:
    book = AlertBook(P)
    a = firing()
    book.add(a, 0, T0)
    book.sent(book.due(T0), T0)
    due = book.due(T0 + 10 * S)
    book.add(a.resolved(T0 + 10 * S), 0, T0 + 10 * S)  # arrives while the re-send is in flight
    book.sent(due, T0 + 11 * S)
    assert states(book.due(T0 + 11 * S)) == [("0", "resolved")]


def test_a_new_severity_ends_the_alert_posted_with_the_old_labels() -> None:
    book = AlertBook(P)
    a = firing()
    book.add(a, 0, T0)
    book.sent(book.due(T0), T0)
    worse = dataclasses.replace(a, severity="critical", ts_ns=a.ts_ns + 3 * S)
    book.add(worse, 0, T0 + 3 * S)
    due = book.due(T0 + 3 * S)
    assert [(x.severity, x.state) for x in due] == [("warning", "resolved"), ("critical", "firing")]
    assert due[0].ts_ns == worse.ts_ns
    book.sent(due, T0 + 3 * S)
    assert book.due(T0 + 4 * S) == [] and [x.severity for x in book.firing] == ["critical"]


def test_a_refused_alert_is_dropped_and_revoked_partitions_forgotten() -> None:
    book = AlertBook(P)
    book.add(firing("0"), 0, T0)
    book.add(firing("1"), 1, T0)
    book.drop(book.due(T0)[0])
    assert states(book.due(T0)) == [("1", "firing")]
    book.forget({1})
    assert book.due(T0) == [] and book.firing == []


def test_batches_are_bounded() -> None:
    book = AlertBook(dataclasses.replace(P, max_batch=3))
    for g in range(7):
        book.add(firing(str(g)), 0, T0)
    assert len(book.due(T0)) == 3


def test_backoff_doubles_up_to_its_cap_and_restarts_on_success() -> None:
    b = Backoff(min_ns=S // 2, max_ns=30 * S)
    delays = [b.failed(T0) - T0 for _ in range(10)]
    assert delays[:4] == [S // 2, S, 2 * S, 4 * S] and max(delays) == 30 * S == delays[-1]
    b.succeeded()
    assert (b.failures, b.retry_at_ns) == (0, 0)
    assert b.failed(T0) - T0 == S // 2


# --- whatever happens, no resurrection and no lost resolution ------------------------------------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("fire"), st.integers(0, 3)),
    st.tuples(st.just("resolve"), st.integers(0, 3)),
    st.tuples(st.just("post"), st.booleans()),
    st.tuples(st.just("wait"), st.integers(1, 30)),
), max_size=60)


@given(events)
def test_no_resolved_alert_is_posted_firing_again_and_no_resolution_is_lost(script: list[tuple[str, int]]) -> None:
    book = AlertBook(P)
    now = T0
    episodes = {g: firing(str(g)) for g in range(4)}
    resolved_at: dict[str, int] = {}  # id -> when its resolution was read
    posted: list[tuple[int, Alert]] = []
    for kind, arg in script:
        now += S
        if kind == "fire":
            book.add(episodes[arg], 0, now)
        elif kind == "resolve":
            a = episodes[arg]
            resolved_at.setdefault(a.id, now)
            book.add(a.resolved(max(now, a.ts_ns)), 0, now)
        elif kind == "post":
            due = book.due(now)
            if arg:  # Alertmanager accepted them
                book.sent(due, now)
                posted += [(now, a) for a in due]
        else:
            now += arg * S
    # Alertmanager comes back for good: everything left is posted.
    for _ in range(5):
        now += P.resend_ns
        due = book.due(now)
        book.sent(due, now)
        posted += [(now, a) for a in due]
    for t, a in posted:
        if a.state == "firing" and a.id in resolved_at:
            assert t < resolved_at[a.id], "a resolved alert was posted firing again"
    fired = {a.id for _, a in posted if a.state == "firing"}
    closed = {a.id for _, a in posted if a.state == "resolved"}
    assert fired & resolved_at.keys() <= closed, "a resolution of a posted alert was never posted"
    assert {a.id for a in book.firing} == {e.id for e in episodes.values()
                                           if e.id not in resolved_at and e.id in fired}
