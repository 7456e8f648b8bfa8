"""Forwarding ``flopwatch.alerts`` to Prometheus Alertmanager (``flopwatch alerts forward``).

Usage::

    flopwatch alerts forward --alertmanager http://127.0.0.1:9094 [--resend-s 60] [--group NAME]

Every alert message (``schemas/alerts.py``, JSON v1) becomes an Alertmanager alert posted
to ``POST /api/v2/alerts``:

- labels: ``alertname`` (the rule), ``severity``, ``node``, ``gpu``, ``workload`` and
  ``namespace`` (when known) and ``alert_id`` (the episode's id), so two GPUs, or two
  episodes of one GPU, never merge into one Alertmanager alert;
- annotations: ``summary``, ``value``, ``threshold``, ``baseline``, ``evidence`` (JSON),
  ``onset_ts_ns``, ``ts_ns``, ``message_id``;
- ``startsAt`` = the onset; for a firing alert ``endsAt`` = now + ``--ends-after-s``
  (default 4 x ``--resend-s``), re-sent every ``--resend-s``; a resolution is posted with
  ``endsAt`` = the resolved time, which ends the alert in Alertmanager at once.

On start the forwarder reads the topic from the beginning (alerts are few; give the topic
``cleanup.policy=compact`` or a long retention) and posts nothing until it has caught up,
so a restarted forwarder re-sends exactly what is still firing and never resurrects a
resolved alert; a firing message that arrives after its resolution (a detector's replay)
is ignored. A resolution is kept until Alertmanager accepts it; when Alertmanager is down
or answers 5xx the forwarder retries with exponential backoff (0.5 s to 30 s), and meanwhile
keeps reading. A message that is not a valid alert is counted and skipped (logged once per
kind of fault); a message Alertmanager refuses as invalid (4xx) is logged and dropped.
Alertmanager itself resolves a firing alert that is not re-sent before its ``endsAt``: a
forwarder that dies leaves nothing firing for ever.

Without ``--group`` a forwarder reads every partition; forwarders given the same
``--group`` split the partitions, each rebuilding its own on assignment. Running two
forwarders on the same partitions is safe: Alertmanager merges identical alerts.
``user:password@`` in the URL is sent as basic auth and never logged; Kafka security
settings (``FLOPWATCH_KAFKA_*``) apply as for every other flopwatch command.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from agents.settings import Settings
from agents.topics import ALERTS, aiokafka_config, confluent_config
from schemas.alerts import Alert, AlertDecodeError, decode_alert

log = logging.getLogger("flopwatch.alerts")
S = 10**9


# --- pure: what to post, and when ---------------------------------------------------------------------------------

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


@dataclass(slots=True)
class Backoff:
    """Exponential retry delays: ``failed`` says when to try next, ``succeeded`` starts over.

    >>> b = Backoff(min_ns=1, max_ns=4)
    >>> [b.failed(now_ns=0) for _ in range(4)], b.succeeded(), b.failed(now_ns=10)
    ([1, 2, 4, 4], None, 11)
    """

    min_ns: int
    max_ns: int
    failures: int = 0
    retry_at_ns: int = 0

    def failed(self, now_ns: int) -> int:
        self.retry_at_ns = now_ns + min(self.max_ns, self.min_ns << min(self.failures, 62))
        self.failures += 1
        return self.retry_at_ns

    def succeeded(self) -> None:
        self.failures, self.retry_at_ns = 0, 0


def redact(url: str) -> str:
    """The URL without its credentials, for logs.

    >>> redact("http://am:s3cret@alerts.example:9093/x"), redact("http://127.0.0.1:9094")
    ('http://***@alerts.example:9093/x', 'http://127.0.0.1:9094')
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def refused_for_good(status: int) -> bool:
    """A 4xx other than timeout / rate limit: the same body will never be accepted."""
    return 400 <= status < 500 and status not in (408, 429)


# --- I/O: Kafka in, HTTP out --------------------------------------------------------------------------------------

@dataclass(slots=True)
class ForwardStats:
    messages: int = 0
    bad: int = 0
    posts: int = 0
    alerts_posted: int = 0
    failed_posts: int = 0
    dropped: int = 0
    firing: int = 0
    pending_resolutions: int = 0
    caught_up: bool = False
    bad_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class AlertForwarder:
    """Reads the alerts topic and keeps Alertmanager in step with it until ``stop`` is set."""

    def __init__(self, settings: Settings, url: str, params: ForwardParams, group: str | None = None,
                 clock: Callable[[], int] = time.time_ns, http_timeout_s: float = 10.0) -> None:
        self.topic = settings.topic_prefix + ALERTS
        self.params = params
        self.book = AlertBook(params)
        self.stats = ForwardStats()
        self._settings = settings
        self._endpoint = url.rstrip("/") + "/api/v2/alerts"
        self._shown = redact(url)
        self._group = group
        self._clock = clock
        self._http_timeout_s = http_timeout_s
        self._backoff = Backoff(params.backoff_min_ns, params.backoff_max_ns)
        self._targets: dict[Any, int] = {}  # TopicPartition -> end offset to reach before posting its alerts
        self._told: set[str] = set()

    async def run(self, stop: asyncio.Event) -> ForwardStats:
        import aiohttp
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(**aiokafka_config(self._settings), group_id=self._group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    client_id="flopwatch-alerts")
        await consumer.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._http_timeout_s)) as http:
                await self._subscribe(consumer)
                log.info("forwarding %s to %s (re-send every %.3g s, endsAt +%.3g s)", self.topic, self._shown,
                         self.params.resend_ns / S, self.params.ends_after_ns / S)
                while not stop.is_set():
                    batch = await consumer.getmany(timeout_ms=200, max_records=1000)
                    now = self._clock()
                    for tp, records in batch.items():
                        for rec in records:
                            self._take(rec.value, tp.partition, rec.offset, now)
                    await self._check_caught_up(consumer)
                    await self._post_due(http)
                await self._post_due(http)  # a resolution read last is posted before leaving, if possible
        finally:
            await consumer.stop()
        return self._update_stats()

    async def _subscribe(self, consumer: Any) -> None:
        from aiokafka import ConsumerRebalanceListener, TopicPartition

        if self._group is not None:
            fwd = self

            class Rebuild(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
                async def on_partitions_revoked(self, revoked: Any) -> None:
                    fwd.book.forget({tp.partition for tp in revoked})
                    for tp in revoked:
                        fwd._targets.pop(tp, None)

                async def on_partitions_assigned(self, assigned: Any) -> None:
                    await fwd._rebuild(consumer, list(assigned))

            consumer.subscribe([self.topic], listener=Rebuild())
            return
        parts = await asyncio.to_thread(_partitions, self._settings, self.topic)
        tps = [TopicPartition(self.topic, p) for p in parts]
        consumer.assign(tps)
        await self._rebuild(consumer, tps)

    async def _rebuild(self, consumer: Any, tps: list[Any]) -> None:
        """Read ``tps`` again from the beginning; their alerts are posted once the end is reached."""
        if not tps:
            return
        await consumer.seek_to_beginning(*tps)
        self._targets.update(await consumer.end_offsets(tps))
        self.stats.caught_up = False

    async def _check_caught_up(self, consumer: Any) -> None:
        if not self._targets:
            return
        for tp, end in list(self._targets.items()):
            if await consumer.position(tp) >= end:
                del self._targets[tp]
        if not self._targets:
            st = self._update_stats()
            st.caught_up = True
            log.info("caught up after %d messages: %d alerts firing, %d resolutions to post", st.messages,
                     st.firing, st.pending_resolutions)

    def _take(self, value: bytes | None, partition: int, offset: int, now_ns: int) -> None:
        if value is None:
            return  # a tombstone of a compacted topic: nothing to post
        self.stats.messages += 1
        try:
            self.book.add(decode_alert(value), partition, now_ns)
        except AlertDecodeError as exc:
            self._skip(exc.reason, f"{exc}", partition, offset)
        except Exception as exc:  # a bug of ours must not stop the forwarder either
            self._skip(f"internal_error:{type(exc).__name__}", repr(exc), partition, offset, exc_info=True)

    def _skip(self, reason: str, detail: str, partition: int, offset: int, exc_info: bool = False) -> None:
        self.stats.bad += 1
        self.stats.bad_reasons[reason] = self.stats.bad_reasons.get(reason, 0) + 1
        if reason not in self._told:
            self._told.add(reason)
            log.warning("skipping a message that is not a valid alert at %s[%d] offset %d: %s "
                        "(more of this kind are counted, not logged)", self.topic, partition, offset, detail,
                        exc_info=exc_info)

    async def _post_due(self, http: Any) -> None:
        now = self._clock()
        if now < self._backoff.retry_at_ns:
            return
        batch = self.book.due(now, held={tp.partition for tp in self._targets})
        if not batch:
            return
        status, detail = await self._post(http, batch, now)
        if status is not None and refused_for_good(status) and len(batch) > 1:
            # Alertmanager refuses the whole request for one invalid alert: find it, one at a time.
            for a in batch:
                status, detail = await self._post(http, [a], now)
                if not self._settle([a], status, detail):
                    return
            return
        self._settle(batch, status, detail)

    def _settle(self, batch: list[Alert], status: int | None, detail: str) -> bool:
        """Book Alertmanager's answer to a post; whether to go on posting now."""
        now = self._clock()
        if status == 200:
            self.book.sent(batch, now)
            self.stats.posts += 1
            self.stats.alerts_posted += len(batch)
            if self._backoff.failures:
                log.info("Alertmanager at %s accepts alerts again", self._shown)
            self._backoff.succeeded()
            resolved = sum(a.state == "resolved" for a in batch)
            log.info("posted %d alerts to Alertmanager (%d firing, %d resolved)", len(batch), len(batch) - resolved,
                     resolved)
            return True
        if status is not None and refused_for_good(status):
            self.book.drop(batch[0])
            self.stats.dropped += 1
            log.error("Alertmanager refused alert %s (%s) with HTTP %d: %s; dropped", batch[0].message_id,
                      batch[0].rule, status, detail)
            return True
        self.stats.failed_posts += 1
        if not self._backoff.failures:
            log.warning("Alertmanager at %s did not take %d alerts (%s); retrying with backoff, nothing is lost",
                        self._shown, len(batch), detail if status is None else f"HTTP {status}: {detail}")
        self._backoff.failed(now)
        return False

    async def _post(self, http: Any, batch: list[Alert], now_ns: int) -> tuple[int | None, str]:
        """POST ``batch`` as sent at ``now_ns``: the HTTP status (None: no answer) and the error text."""
        import aiohttp

        body = orjson.dumps([postable(a, now_ns, self.params) for a in batch])
        try:
            async with http.post(self._endpoint, data=body, headers={"Content-Type": "application/json"}) as resp:
                text = "" if resp.status == 200 else (await resp.text())[:300].strip()
                return resp.status, text
        except (aiohttp.ClientError, TimeoutError) as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def _update_stats(self) -> ForwardStats:
        self.stats.firing = len(self.book.firing)
        self.stats.pending_resolutions = self.book.pending_resolutions
        return self.stats


def _partitions(settings: Settings, topic: str) -> list[int]:
    """The partitions of ``topic`` (aiokafka's consumer has no public call for a topic it does not subscribe to)."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient(confluent_config(settings)).list_topics(topic, timeout=30)
    found = meta.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise RuntimeError(f"topic {topic} does not exist (any flopwatch command creates it)")
    return sorted(found.partitions)

