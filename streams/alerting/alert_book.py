"""The alert book of ``flopwatch alerts forward``: which episodes are firing or resolved, when each is
posted again, and the Alertmanager payload of each; pure, time is an argument.

The forwarder (``agents/sinks/alertmanager.py``, which documents the behaviour) feeds it messages in topic order
and posts what it says is due.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from schemas.alerts import Alert

S = 10**9


@dataclass(frozen=True, slots=True)
class ForwardParams:
    """How the forwarder talks to Alertmanager; all times in nanoseconds."""

    resend_ns: int = 60 * S
    """A firing alert is posted again this long after it was last accepted."""
    # 4 x resend: three re-sends in a row may fail before Alertmanager ends an alert on its own,
    # and the alerts of a forwarder that died end within four minutes.
    ends_after_ns: int = 240 * S
    """``endsAt`` of a firing alert: this long after each send."""
    resolved_window_ns: int = 3600 * S
    """A resolution of an alert this forwarder has not posted itself (read while rebuilding) is
    posted only if it is younger than this: an older one's alert has long ended in Alertmanager."""
    generator_url: str = ""
    """``generatorURL`` template with ``{id}``, ``{rule}``, ``{node}``, ``{gpu}``; empty: none sent."""
    max_batch: int = 500
    """Most alerts in one POST."""
    backoff_min_ns: int = S // 2
    backoff_max_ns: int = 30 * S

    def __post_init__(self) -> None:
        if self.resend_ns <= 0:
            raise ValueError("the re-send interval must be > 0")
        if self.ends_after_ns <= self.resend_ns:
            raise ValueError("endsAt must lie beyond the next re-send (ends-after > resend), or alerts flap")
        if self.generator_url:
            try:
                self.generator_url.format(id="x", rule="x", node="x", gpu="x")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"generator URL {self.generator_url!r}: only {{id}}, {{rule}}, {{node}} and {{gpu}} "
                                 f"can be filled in ({type(exc).__name__}: {exc})") from None

    @classmethod
    def from_seconds(cls, resend_s: float = 60.0, ends_after_s: float | None = None, **others: Any) -> ForwardParams:
        ends = 4 * resend_s if ends_after_s is None else ends_after_s
        return cls(resend_ns=int(resend_s * S), ends_after_ns=int(ends * S), **others)


def rfc3339(ts_ns: int) -> str:
    """UTC, with all nine digits of the nanoseconds (Alertmanager keeps them; its API shows milliseconds).

    >>> rfc3339(1_796_200_344_123_456_789)
    '2026-12-02T08:32:24.123456789Z'
    """
    secs, frac = divmod(ts_ns, S)
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def alert_labels(a: Alert) -> dict[str, str]:
    """The labels (Alertmanager's identity of an alert): empty ones left out."""
    out = {"alertname": a.rule, "severity": a.severity, "node": a.node, "gpu": a.gpu, "alert_id": a.id}
    if a.workload:
        out["workload"] = a.workload
    if a.namespace:
        out["namespace"] = a.namespace
    return out


def alert_annotations(a: Alert) -> dict[str, str]:
    base = "" if a.baseline is None else f", baseline {a.baseline:.6g}"
    out = {"summary": f"{a.rule} on {a.node} GPU {a.gpu}: {a.value:.6g} against threshold {a.threshold:.6g}{base}",
           "value": repr(a.value), "threshold": repr(a.threshold), "onset_ts_ns": str(a.onset_ts_ns),
           "ts_ns": str(a.ts_ns), "message_id": a.message_id}
    if a.baseline is not None:
        out["baseline"] = repr(a.baseline)
    if a.evidence:
        out["evidence"] = orjson.dumps(dict(a.evidence), option=orjson.OPT_SORT_KEYS).decode()
    if a.causes:  # attribution: the ranked list as JSON, and the likeliest cause in words
        out["causes"] = orjson.dumps([c.as_dict() for c in a.causes], option=orjson.OPT_SORT_KEYS).decode()
        top = a.causes[0]
        out["likely_cause"] = f"{top.cause} (confidence {top.confidence:.2f})"
    return out


def postable(a: Alert, now_ns: int, params: ForwardParams) -> dict[str, Any]:
    """One element of the ``POST /api/v2/alerts`` body, as sent at ``now_ns``."""
    # endsAt >= startsAt or Alertmanager refuses the alert (an onset ahead of our clock must not do that).
    ends_ns = max(now_ns, a.onset_ts_ns) + params.ends_after_ns if a.state == "firing" else a.ts_ns
    body: dict[str, Any] = {"labels": alert_labels(a), "annotations": alert_annotations(a),
                            "startsAt": rfc3339(a.onset_ts_ns), "endsAt": rfc3339(ends_ns)}
    if params.generator_url:
        q = urllib.parse.quote
        body["generatorURL"] = params.generator_url.format(id=a.id, rule=a.rule, node=q(a.node, safe=""),
                                                           gpu=q(a.gpu, safe=""))
    return body


@dataclass(slots=True)
class _Entry:
    alert: Alert  # the latest message of the episode
    partition: int
    due_ns: int  # next post
    posted: bool = False  # Alertmanager accepted this alert's current labels from us


class AlertBook:
    """The alerts to post and when: fed messages in topic order, asked what is due at a time.

    >>> from schemas.alerts import make_alert
    >>> book = AlertBook(ForwardParams(resend_ns=10, ends_after_ns=40))
    >>> a = make_alert("util_spike", "warning", "n", "0", value=99.0, threshold=95.0, onset_ts_ns=100, ts_ns=105)
    >>> book.add(a, partition=0, now_ns=110)
    True
    >>> due = book.due(110); [x.state for x in due]
    ['firing']
    >>> book.sent(due, now_ns=111); book.due(115), [x.state for x in book.due(121)]
    ([], ['firing'])
    >>> book.add(a.resolved(130), 0, now_ns=131), [x.state for x in book.due(131)]
    (True, ['resolved'])
    >>> book.sent(book.due(131), now_ns=132); book.add(a, 0, now_ns=140), book.due(10**6)
    (False, [])
    """

    def __init__(self, params: ForwardParams) -> None:
        self.params = params
        self._open: dict[str, _Entry] = {}  # firing, or a resolution waiting to be posted
        self._retired: list[_Entry] = []  # an earlier label set of an open alert, posted as resolved
        self._closed: dict[str, int] = {}  # id -> partition of episodes whose resolution was read

    def add(self, alert: Alert, partition: int, now_ns: int) -> bool:
        """Take one message; whether it changed what will be posted."""
        if alert.id in self._closed:
            return False  # resolved episodes never fire again; a repeated resolution changes nothing
        entry = self._open.get(alert.id)
        if entry is not None and entry.posted and alert_labels(alert) != alert_labels(entry.alert):
            # A new severity or workload makes another Alertmanager alert: end the one posted before.
            self._retired.append(_Entry(entry.alert.resolved(max(alert.ts_ns, entry.alert.ts_ns)), entry.partition,
                                        now_ns, True))
            entry.posted, entry.due_ns = False, now_ns
        if alert.state == "resolved":
            self._closed[alert.id] = partition
            posted = entry is not None and entry.posted
            if posted or alert.ts_ns + self.params.resolved_window_ns > now_ns:
                self._open[alert.id] = _Entry(alert, partition, now_ns, posted)
            else:
                self._open.pop(alert.id, None)
        elif entry is None:
            self._open[alert.id] = _Entry(alert, partition, now_ns)
        else:
            if alert.causes != entry.alert.causes:
                entry.due_ns = now_ns  # the attribution: post it now, not at the next resend
            entry.alert = alert
        return True

    def due(self, now_ns: int, held: Collection[int] = ()) -> list[Alert]:
        """What to post at ``now_ns`` (at most ``max_batch``), leaving out the ``held`` partitions."""
        out = [e.alert for e in self._retired if e.partition not in held]
        out += [e.alert for e in self._open.values() if e.due_ns <= now_ns and e.partition not in held]
        return out[: self.params.max_batch]

    def sent(self, alerts: Sequence[Alert], now_ns: int) -> None:
        """Alertmanager accepted ``alerts`` (as returned by ``due``) at ``now_ns``."""
        done = {id(a) for a in alerts}
        self._retired = [e for e in self._retired if id(e.alert) not in done]
        for a in alerts:
            entry = self._open.get(a.id)
            if entry is None or entry.alert is not a:
                continue  # a newer message came meanwhile; it is due on its own
            if a.state == "resolved":
                del self._open[a.id]
            else:
                entry.posted, entry.due_ns = True, now_ns + self.params.resend_ns

    def drop(self, alert: Alert) -> None:
        """Alertmanager refused ``alert`` for good: stop posting it."""
        self._retired = [e for e in self._retired if e.alert is not alert]
        entry = self._open.get(alert.id)
        if entry is not None and entry.alert is alert:
            del self._open[alert.id]

    def forget(self, partitions: Collection[int]) -> None:
        """Another forwarder owns ``partitions`` now (it rebuilds them and posts what they hold)."""
        self._open = {k: e for k, e in self._open.items() if e.partition not in partitions}
        self._retired = [e for e in self._retired if e.partition not in partitions]
        self._closed = {k: p for k, p in self._closed.items() if p not in partitions}

    @property
    def firing(self) -> list[Alert]:
        return [e.alert for e in self._open.values() if e.alert.state == "firing"]

    @property
    def pending_resolutions(self) -> int:
        return len(self._retired) + sum(e.alert.state == "resolved" for e in self._open.values())
