"""``flopwatch act``: an example consumer of ``flopwatch.triggers`` that acts once per idempotency key.

Usage::

    flopwatch act [--dry-run | --webhook URL | --exec [--kubectl PATH]] [--state .flopwatch/act.sqlite]
                  [--retain-days 7] [--from-beginning] [--group NAME] [--exit-when-idle SECONDS]

It reads the triggers topic with ``isolation_level=read_committed`` (a transactional
producer's aborted writes are never seen), decodes each message with
``schemas.triggers.decode_trigger`` and, for each idempotency key it has not acted on yet:

- ``--dry-run`` (the default) prints the command it would run, one line per trigger:
  ``kubectl scale deployment/<workload> --namespace <ns> --replicas=<desired>`` for
  scale_up, scale_down and rollback (a rollback's comment names the decision it
  reverses), ``kubectl rollout restart deployment/<workload> --namespace <ns>`` for a
  rebalance; each line ends in a shell comment with the idempotency key, escaped;
- ``--webhook URL`` POSTs the trigger's JSON (``encode_trigger``: equal triggers give equal
  bytes) with the header ``Idempotency-Key: <key>``, retrying connection errors, timeouts,
  5xx, 408, 425 and 429 with exponential backoff (0.5 s to 30 s) until it is answered 2xx;
  any other answer is a refusal that no retry would change: it is logged as an error and
  recorded as ``refused`` so a restart does not post it again. ``user:password@`` in the
  URL is sent as basic auth and never logged;
- ``--exec`` runs kubectl itself (an argument list, never a shell), up to 5 attempts with
  backoff; a command that still fails is logged and recorded as ``failed``.

Namespace and workload are checked as Kubernetes names (``agents.act.commands``) before
they are put into a command; a trigger with a name Kubernetes would not accept is
refused (logged, recorded as ``refused``). A message that is not a valid trigger is
logged with its topic, partition, offset and reason, and skipped.

Exactly once, and the one window
--------------------------------
For each trigger: the act happens, then its key is recorded in the ledger (a SQLite file,
``agents.act.ledger``; the row and the action's result are one transaction), then the
Kafka offset is committed (after each poll's records, and when a partition is revoked).
A restart re-reads from the last commit, finds the keys it already recorded and skips
them (at debug level), so a trigger delivered twice, by a producer that replayed after a
crash or by this consumer's own restart, is acted on once. A copy whose key is known but
whose bytes differ is not acted on either, and is logged as a warning: a key names one
decision. SIGTERM/SIGINT stops between triggers, or in a retry's backoff, where the
trigger is left unrecorded and uncommitted for the next start.

The ledger cannot make the act and its record one atomic step. A crash (SIGKILL, power)
after the act and before the ledger's commit leaves the key unrecorded, and the restarted
consumer acts on that one trigger again. With ``--dry-run`` that reprints a line; with
``--exec`` it re-runs ``kubectl scale --replicas=N`` (harmless: the same absolute count)
or ``kubectl rollout restart`` (a second restart). With ``--webhook`` the receiver sees
the same request twice, with the same ``Idempotency-Key`` and the same body: a receiver
that remembers the keys it applied (what the header is for) applies it once, which closes
the window end to end. The consumer never records a key before the webhook answered 2xx,
so nothing is lost either. tests/integration/test_act.py makes the receiver SIGKILL the
consumer right after a 2xx: in some runs the ledger had the key, in others the key was
posted a second time, and never any other key.

The ledger is bounded: keys whose trigger ``ts_ns`` is older than ``--retain-days`` are
purged (at start, then hourly), and triggers older than that are not acted on at all
(logged as stale), since the ledger can no longer vouch for them.

A group without committed offsets starts at the newest trigger (``--from-beginning``: at
the oldest still on the topic); its position is committed at once, so triggers published
while it is down are not skipped by a restart. Consumers sharing ``--group`` split the
partitions, each with its own ledger: a trigger acted on but not yet committed when its
partition moves is acted on again by the new owner, so run one consumer per ledger, or
let the webhook's Idempotency-Key settle it. ``--dry-run`` uses a group and ledger rows of
its own, so a preview never makes a real run skip a trigger.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from agents.act.commands import shown
from agents.act.ledger import ActLedger, Entry
from agents.act.sinks import Sink
from agents.kafka.topics import Topics, aiokafka_config
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from agents.settings import Settings
from schemas.counters import Counters
from schemas.triggers import TriggerDecodeError, decode_trigger, encode_trigger

log = logging.getLogger("flopwatch.act")

S = 1_000_000_000
DAY_NS = 86_400 * S
PURGE_EVERY_NS = 3_600 * S
COMMIT_TIMEOUT_S = 30.0




@dataclass(frozen=True, slots=True)
class ActParams:
    group: str
    from_beginning: bool = False
    retain_ns: int = 7 * DAY_NS
    exit_when_idle_s: float | None = None


@dataclass(slots=True)
class ActStats(Counters):
    messages: int = 0
    acted: int = 0
    already_done: int = 0
    bad: int = 0
    stale: int = 0
    refused: int = 0
    failed: int = 0
    commits: int = 0
    purged: int = 0
    bad_reasons: dict[str, int] = field(default_factory=dict)


class TriggerConsumer:
    """Reads the triggers topic and acts on each new idempotency key through ``sink`` until ``stop`` is set."""

    def __init__(self, settings: Settings, sink: Sink, ledger: ActLedger, params: ActParams,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        if ledger.mode != sink.mode:
            raise ValueError(f"a {ledger.mode} ledger cannot vouch for the {sink.mode} sink {sink.name}")
        self.topic = Topics(settings.topic_prefix).triggers
        self.stats = ActStats()
        self._settings = settings
        self._sink = sink
        self._ledger = ledger
        self._params = params
        self._clock = clock
        self._pending: dict[Any, int] = {}  # TopicPartition -> next offset, acted and recorded, not committed
        self._anchored: set[Any] = set()  # partitions known to have a committed offset
        self._consumer: Any = None

    async def run(self, stop: asyncio.Event) -> ActStats:
        from aiokafka import AIOKafkaConsumer

        await self._sink.open()  # first: a sink that cannot work (no kubectl) stops us before we join the group
        try:
            consumer = self._consumer = AIOKafkaConsumer(
                **aiokafka_config(self._settings), group_id=self._params.group, enable_auto_commit=False,
                auto_offset_reset="earliest" if self._params.from_beginning else "latest",
                isolation_level="read_committed", client_id="flopwatch-act")
            consumer.subscribe([self.topic], listener=self._listener())
            await consumer.start()
            try:
                self._purge()
                log.info("acting on %s by %s (group %s, ledger %s with %d keys, retention %.3g days)", self.topic,
                         self._sink.name, self._params.group, self._ledger.path, len(self._ledger),
                         self._params.retain_ns / DAY_NS)
                await self._loop(consumer, stop)
                await self._commit()
            finally:
                await self._stop_consumer(consumer)
        finally:
            await self._sink.close()
        return self.stats

    @staticmethod
    async def _stop_consumer(consumer: Any) -> None:
        try:
            # Leaving the group lets another consumer take over at once; bounded, as in the ingest.
            await asyncio.wait_for(consumer.stop(), 15.0)
        except TimeoutError:
            log.warning("Kafka consumer did not stop within 15 s; leaving anyway")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled, not just aiokafka's fetcher (a broker gone while stopping)
            log.warning("Kafka consumer was cut short while stopping; leaving anyway")

    async def _loop(self, consumer: Any, stop: asyncio.Event) -> None:
        last_purge = quiet_since = self._clock.mono_ns()
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=500)
            await self._anchor(consumer, batch)
            for tp, records in batch.items():
                for rec in records:
                    if stop.is_set() or tp not in consumer.assignment():
                        break  # not acted on: the next owner (or the next start) reads it again
                    if not await self._take(tp, rec, stop):
                        break
                    if tp in consumer.assignment():
                        self._pending[tp] = rec.offset + 1
            await self._commit()
            now = self._clock.mono_ns()
            if now - last_purge >= PURGE_EVERY_NS:
                self._purge()
                last_purge = now
            if batch or not await self._caught_up(consumer):
                quiet_since = now
            elif self._params.exit_when_idle_s is not None and now - quiet_since >= self._params.exit_when_idle_s * S:
                log.info("caught up and nothing new for %.3g s; stopping", self._params.exit_when_idle_s)
                stop.set()

    async def _take(self, tp: Any, rec: Any, stop: asyncio.Event) -> bool:
        """Act on one record unless it is invalid, stale or done; False if stopped before the act settled."""
        self.stats.messages += 1
        where = f"{tp.topic}[{tp.partition}] offset {rec.offset}"
        if rec.value is None:
            log.debug("tombstone at %s: nothing to act on", where)
            return True
        try:
            t = decode_trigger(rec.value)
        except TriggerDecodeError as exc:
            self._bad(exc.reason, where, str(exc))
            return True
        except Exception as exc:  # a bug of ours or the validator's must not stop the consumer
            self._bad(f"internal_error:{type(exc).__name__}", where, repr(exc), exc_info=True)
            return True
        key = shown(t.idempotency_key)
        horizon = self._clock.wall_ns() - self._params.retain_ns
        if t.ts_ns < horizon:
            self.stats.stale += 1
            log.warning("not acting on %s at %s: the trigger is older than the ledger's retention (%.3g days), "
                        "so the ledger cannot say whether it was acted on", key, where,
                        self._params.retain_ns / DAY_NS)
            return True
        body = encode_trigger(t)
        digest = hashlib.sha256(body).hexdigest()
        prior = self._ledger.lookup(t.idempotency_key)
        if prior is not None:
            self.stats.already_done += 1
            if prior.digest != digest:
                log.warning("%s at %s was acted on before (%s, from %s[%d] offset %d) with different content; "
                            "not acting again: a key names one decision", key, where, prior.outcome, prior.topic,
                            prior.partition, prior.offset)
            else:
                log.debug("already acted on %s (%s, from %s[%d] offset %d); skipping the copy at %s", key,
                          prior.outcome, prior.topic, prior.partition, prior.offset, where)
            return True
        result = await self._sink.act(t, body, stop)
        if result is None:
            return False
        try:
            self._ledger.record(Entry(t.idempotency_key, t.ts_ns, t.id, digest, t.action, result.outcome,
                                      result.detail, self._clock.wall_ns(), tp.topic, tp.partition, rec.offset))
        except Exception:
            log.critical("%s at %s was acted on (%s) but could not be recorded; a restart acts on it again",
                         key, where, result.outcome)
            raise
        if result.outcome == "refused":
            self.stats.refused += 1
            log.error("refused trigger %s (%s of %s) at %s: %s", key, t.action,
                      shown(f"{t.namespace}/{t.workload}"), where, result.detail)
        elif result.outcome == "failed":
            self.stats.failed += 1
            log.error("trigger %s at %s failed: %s; recorded as failed, not retried", key, where, result.detail)
        else:
            self.stats.acted += 1
            log.info("%s %s (%s of %s, desired %d replicas)", result.outcome, key, t.action,
                     shown(f"{t.namespace}/{t.workload}"), t.desired)
        return True

    def _bad(self, reason: str, where: str, detail: str, exc_info: bool = False) -> None:
        self.stats.bad += 1
        self.stats.bad_reasons[reason] = self.stats.bad_reasons.get(reason, 0) + 1
        log.error("skipping the message at %s: not a valid trigger (%s); nothing was acted on", where, detail,
                  exc_info=exc_info)

    def _purge(self) -> None:
        gone = self._ledger.purge(self._clock.wall_ns() - self._params.retain_ns)
        self.stats.purged += gone
        if gone:
            log.info("purged %d keys older than %.3g days from the ledger", gone, self._params.retain_ns / DAY_NS)

    async def _caught_up(self, consumer: Any) -> bool:
        """Every assigned partition fetched at least once and read up to its last stable offset."""
        assigned = consumer.assignment()
        if not assigned:
            return False
        for tp in assigned:
            end = consumer.last_stable_offset(tp)
            if end is None or end < 0:
                end = consumer.highwater(tp)
            if end is None or await consumer.position(tp) < end:
                return False
        return True

    async def _commit(self, only: Any = None) -> None:
        """Commit what was acted on and recorded (for the partitions ``only``, if given)."""
        from aiokafka.errors import CommitFailedError, KafkaError

        offsets = {tp: o for tp, o in self._pending.items() if only is None or tp in only}
        if not offsets:
            return
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), COMMIT_TIMEOUT_S)
        except CommitFailedError as exc:
            # The group moved on: the new owner reads these again, and a ledger that has them skips them.
            log.warning("offset commit refused after a rebalance; the partitions' new owner re-reads them: %s", exc)
        except (TimeoutError, KafkaError) as exc:
            log.warning("offset commit did not complete (%s); the next one covers it, and a restart before then "
                        "skips what the ledger holds", exc or "timed out")
            return
        else:
            self.stats.commits += 1
        for tp in offsets:
            if self._pending.get(tp) == offsets[tp]:
                del self._pending[tp]

    async def _anchor(self, consumer: Any, batch: dict[Any, list[Any]]) -> None:
        """Commit where each newly assigned partition without a committed offset starts, before acting on it.

        Without it a group reset to "latest" that dies before its first commit would, on
        restart, reset to the new end and skip the triggers it had not yet acted on, and
        those published while it was down. The start is the first record ``batch`` holds for
        the partition (getmany has moved the position past it), or else the position.
        """
        from aiokafka.errors import KafkaError

        for tp in consumer.assignment() - self._anchored:
            try:
                if await consumer.committed(tp) is None:
                    records = batch.get(tp)
                    start = records[0].offset if records else await consumer.position(tp)
                    await asyncio.wait_for(consumer.commit({tp: start}), COMMIT_TIMEOUT_S)
                    log.debug("%s[%d] had no committed offset: committed its start %d", tp.topic, tp.partition,
                              start)
            except (TimeoutError, KafkaError) as exc:
                log.warning("could not commit the start of %s[%d] (%s); trying again", tp.topic, tp.partition,
                            exc or "timed out")
                continue
            self._anchored.add(tp)

    def _listener(self) -> Any:
        from aiokafka import ConsumerRebalanceListener

        outer = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
            async def on_partitions_revoked(self, revoked: Any) -> None:
                # The textbook place for the last commit of partitions about to move.
                await outer._commit(only=set(revoked))
                for tp in revoked:
                    outer._pending.pop(tp, None)
                    outer._anchored.discard(tp)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                log.info("assigned partitions %s of %s", sorted(tp.partition for tp in assigned), outer.topic)

        return Listener()
