"""Forwarding ``flopwatch.alerts`` to Prometheus Alertmanager (``flopwatch alerts forward``).

Usage::

    flopwatch alerts forward --alertmanager http://127.0.0.1:9094 [--resend-s 60] [--group NAME]

Every alert message (``schemas/alerts.py``, JSON v2; v1 is read too) becomes an Alertmanager alert posted
to ``POST /api/v2/alerts``:

- labels: ``alertname`` (the rule), ``severity``, ``node``, ``gpu``, ``workload`` and
  ``namespace`` (when known) and ``alert_id`` (the episode's id), so two GPUs, or two
  episodes of one GPU, never merge into one Alertmanager alert;
- annotations: ``summary``, ``value``, ``threshold``, ``baseline``, ``evidence`` (JSON),
  ``onset_ts_ns``, ``ts_ns``, ``message_id``, and once the episode is attributed ``causes``
  (the ranked list as JSON) and ``likely_cause`` (the first, in words); an attribution is
  posted as soon as it is read;
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
from dataclasses import dataclass, field
from typing import Any

import orjson

from agents.kafka.topics import ALERTS, aiokafka_config, confluent_config
from agents.runtime.backoff import Backoff
from agents.runtime.logs import redact
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from agents.settings import Settings
from schemas.alerts import Alert, AlertDecodeError, decode_alert
from schemas.counters import Counters

# The pure book lives in streams/alerting/alert_book.py; its names are re-exported for callers and tests.
from streams.alerting.alert_book import (
    AlertBook,
    ForwardParams,
    S,
    alert_annotations,
    alert_labels,
    postable,
    rfc3339,
)

__all__ = ["AlertBook", "AlertForwarder", "ForwardParams", "ForwardStats", "S", "alert_annotations", "alert_labels",
           "postable", "refused_for_good", "rfc3339"]

# doctest.testmod only looks at objects defined in the module it is given; this keeps the book's examples
# run by ``doctest.testmod(agents.sinks.alertmanager)`` as before the split.
__test__ = {"rfc3339": rfc3339, "AlertBook": AlertBook}

log = logging.getLogger("flopwatch.alerts")


# --- pure: retries and logging of the HTTP side -------------------------------------------------------------------

def refused_for_good(status: int) -> bool:
    """A 4xx other than timeout / rate limit: the same body will never be accepted."""
    return 400 <= status < 500 and status not in (408, 429)


# --- I/O: Kafka in, HTTP out --------------------------------------------------------------------------------------

@dataclass(slots=True)
class ForwardStats(Counters):
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


class AlertForwarder:
    """Reads the alerts topic and keeps Alertmanager in step with it until ``stop`` is set."""

    def __init__(self, settings: Settings, url: str, params: ForwardParams, group: str | None = None,
                 clock: Clock = SYSTEM_CLOCK, http_timeout_s: float = 10.0) -> None:
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
                    now = self._clock.wall_ns()
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
        now = self._clock.wall_ns()
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
        now = self._clock.wall_ns()
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

