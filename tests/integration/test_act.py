"""``flopwatch act`` against a real Kafka: once per idempotency key, across repeats, restarts and a SIGKILL.

Triggers go in with the project's producer (and a transactional one, for read_committed);
``flopwatch act`` runs as a subprocess; a loopback HTTP server stands in for the webhook
and a small script for kubectl.
"""

from __future__ import annotations

import collections
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from agents.act.ledger import ActLedger
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings
from schemas.triggers import Action, Trigger, decode_trigger, encode_trigger, make_trigger
from tests.integration.helpers import worker_env

pytestmark = pytest.mark.integration

S = 10**9
KEY_IN_LINE = re.compile(r'  # .*idempotency_key=(".*")$')


def act_cmd(*extra: str, verbose: bool = False) -> list[str]:
    return [sys.executable, "-m", "agents.cli.main", *(["-v"] if verbose else []), "act", *extra]


@dataclass(frozen=True)
class Run:
    returncode: int
    lines: list[str]
    stderr: str

    @property
    def keys(self) -> list[str]:
        """The idempotency key of every line printed, in order."""
        out = []
        for ln in self.lines:
            m = KEY_IN_LINE.search(ln)
            assert m, f"not a dry-run line: {ln!r}"
            out.append(json.loads(m.group(1)))
        return out

    @property
    def stats(self) -> dict[str, Any]:
        last = [ln for ln in self.stderr.splitlines() if ln.startswith('{"event":"stopped"')]
        assert last, self.stderr[-4000:]
        got: dict[str, Any] = json.loads(last[-1])
        return got


def run_act(settings: Settings, *extra: str, verbose: bool = False, timeout_s: float = 120.0) -> Run:
    proc = subprocess.run(act_cmd(*extra, verbose=verbose), env=worker_env(settings), capture_output=True, text=True,
                          timeout=timeout_s)  # run() kills it on timeout
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Run(proc.returncode, proc.stdout.splitlines(), proc.stderr)


def trig(action: Action, namespace: str, workload: str, ts_ns: int, current: int = 2, desired: int = 3,
         reverses: str | None = None) -> Trigger:
    return make_trigger(action, namespace, workload, "inference", ts_ns=ts_ns, current=current, desired=desired,
                        reasons=("qps",), evidence={"qps": {"value": 900.0, "threshold": 800.0, "window_s": 30.0}},
                        reverses=reverses)


def publish(settings: Settings, *messages: Trigger | bytes) -> None:
    producer = SampleProducer(settings)
    topic = Topics(settings.topic_prefix).triggers
    for m in messages:
        if isinstance(m, Trigger):
            producer.send(topic, encode_trigger(m), key=m.key)
        else:
            producer.send(topic, m, key=b"junk")
    producer.close()


def publish_in_transactions(settings: Settings, committed: list[Trigger], aborted: list[Trigger]) -> None:
    """One committed and one aborted transaction, as a transactional decision engine would write them."""
    producer = Producer(confluent_config(settings) | {"transactional.id": f"act-test-{settings.group_id}"})
    topic = Topics(settings.topic_prefix).triggers
    producer.init_transactions(30)
    for batch, commit in ((aborted, False), (committed, True)):
        producer.begin_transaction()
        for t in batch:
            producer.produce(topic, encode_trigger(t), t.key)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    producer.flush(30)


# --- dry run ---------------------------------------------------------------------------------------------------

def test_dry_run_prints_each_key_once_across_repeats_restarts_and_groups(base_settings: Settings,
                                                                         tmp_path: Path) -> None:
    now = time.time_ns()
    state = str(tmp_path / "act.sqlite")
    up = trig("scale_up", "serving", "chat", now, current=4, desired=6)
    down = trig("scale_down", "batch", "etl", now + 1, current=6, desired=2)
    back = trig("rollback", "batch", "etl", now + 2, current=2, desired=6, reverses=down.id)
    rebalance = trig("rebalance", "ml", "trainer", now + 3, current=8, desired=8)
    bad_name = trig("scale_up", "serving", "chat;kubectl delete ns prod", now + 4)
    stale = trig("scale_up", "serving", "old", now - 8 * 86_400 * S)
    publish(base_settings, up, down, b"{not json", up, back, rebalance, b'{"v": 2}', bad_name, stale, down)
    in_txn, aborted = trig("scale_up", "serving", "txn", now + 5), trig("scale_up", "serving", "aborted", now + 6)
    publish_in_transactions(base_settings, committed=[in_txn], aborted=[aborted])

    first = run_act(base_settings, "--dry-run", "--from-beginning", "--exit-when-idle", "3", "--state", state)
    want = [up, down, back, rebalance, in_txn]
    assert sorted(first.keys) == sorted(t.idempotency_key for t in want), first.stderr[-4000:]
    by_key = dict(zip(first.keys, first.lines, strict=True))
    assert by_key[up.idempotency_key].startswith(
        "kubectl scale deployment/chat --namespace serving --replicas=6  # scale_up ")
    assert by_key[down.idempotency_key].startswith(
        "kubectl scale deployment/etl --namespace batch --replicas=2  # scale_down ")
    assert by_key[back.idempotency_key].startswith(
        f"kubectl scale deployment/etl --namespace batch --replicas=6  # rollback of decision {down.id} ")
    assert by_key[rebalance.idempotency_key].startswith(
        "kubectl rollout restart deployment/trainer --namespace ml  # rebalance ")
    # One workload's triggers share a partition, in order: the rollback comes after what it reverses.
    assert first.keys.index(down.idempotency_key) < first.keys.index(back.idempotency_key)
    st = first.stats
    assert (st["acted"], st["already_done"], st["bad"], st["refused"], st["stale"]) == (5, 2, 2, 1, 1), st
    assert st["bad_reasons"] == {"malformed_json": 1, "unknown_version": 1}
    for reason in ("malformed_json", "unknown_version"):
        assert re.search(rf"skipping the message at {re.escape(Topics(base_settings.topic_prefix).triggers)}"
                         rf"\[\d\] offset \d+: not a valid trigger \({reason}", first.stderr), first.stderr[-4000:]
    assert "is not an RFC 1123 subdomain" in first.stderr and "older than the ledger's retention" in first.stderr

    # New triggers and repeats of old ones: only the new are acted on, with the same ledger and group.
    new = [trig("scale_up", "serving", "chat", now + 10, current=6, desired=8),
           trig("scale_down", "ml", "trainer", now + 11, current=8, desired=4)]
    publish(base_settings, up, new[0], back, new[1], new[1])
    second = run_act(base_settings, "--dry-run", "--exit-when-idle", "3", "--state", state)
    assert sorted(second.keys) == sorted(t.idempotency_key for t in new), second.stderr[-4000:]
    assert (second.stats["acted"], second.stats["already_done"]) == (2, 3), second.stats

    # A fresh group reads everything again from the beginning: the ledger alone keeps it from acting twice.
    third = run_act(base_settings, "--dry-run", "--from-beginning", "--group", f"{base_settings.group_id}-x",
                    "--exit-when-idle", "3", "--state", state, verbose=True)
    assert third.lines == [], third.lines
    # 16 messages seen (the aborted one never): 2 not triggers, 1 stale, and the other 13 all done before.
    st = third.stats
    assert (st["messages"], st["acted"], st["bad"], st["stale"], st["already_done"]) == (16, 0, 2, 1, 13), st
    assert "DEBUG flopwatch.act: already acted on" in third.stderr


# --- webhook and SIGKILL -----------------------------------------------------------------------------------------

@dataclass
class Receiver:
    """A webhook that records every request; it refuses some first attempts and SIGKILLs its caller once."""

    fail_first_of: set[str]
    kill_after_accepting: int  # SIGKILL the consumer right after answering 2xx to this many distinct keys
    down: bool = False  # answer 503 to everything
    pid: int | None = None
    requests: list[tuple[str, str, bytes, int]] = field(default_factory=list)  # (path, key header, body, status)
    lock: threading.Lock = field(default_factory=threading.Lock)
    killed: str | None = None  # the key whose 2xx answer was the last thing the killed process got

    def accepted(self) -> collections.Counter[str]:
        return collections.Counter(k for _, k, _, status in self.requests if status == 200)

    def answer(self, path: str, key: str, body: bytes) -> tuple[int, bool]:
        """The status for this request and whether to kill the caller after sending it."""
        with self.lock:
            seen = [k for _, k, _, _ in self.requests]
            status = 503 if self.down or (key in self.fail_first_of and key not in seen) else 200
            self.requests.append((path, key, body, status))
            accepted = {k for _, k, _, s in self.requests if s == 200}
            kill = (status == 200 and self.killed is None and self.pid is not None
                    and len(accepted) == self.kill_after_accepting)
            if kill:
                self.killed = key
            return status, kill


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    rec = Receiver(fail_first_of=set(), kill_after_accepting=0)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status, kill = rec.answer(self.path, self.headers.get("Idempotency-Key", ""), body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.wfile.flush()
            if kill:
                assert rec.pid is not None
                os.kill(rec.pid, signal.SIGKILL)  # after the 2xx went out: the crash window, on purpose

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield rec, f"http://hook:s3cret-pw@127.0.0.1:{server.server_address[1]}/triggers"
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_gets_each_key_once_across_a_sigkill(base_settings: Settings, tmp_path: Path,
                                                     receiver: tuple[Receiver, str]) -> None:
    rec, url = receiver
    now = time.time_ns()
    triggers = [trig("scale_up", "serving", f"svc-{i}", now + i, current=2, desired=3 + i % 3) for i in range(24)]
    keys = {t.idempotency_key for t in triggers}
    rec.fail_first_of = {t.idempotency_key for t in triggers[::5]}  # retried with backoff, then accepted
    rec.kill_after_accepting = 10
    publish(base_settings, *triggers, *triggers[:6])  # the producer repeated some after a crash of its own
    state = str(tmp_path / "act.sqlite")
    log1 = tmp_path / "first.log"
    with log1.open("w") as err:
        first = subprocess.Popen(act_cmd("--webhook", url, "--from-beginning", "--state", state),
                                 env=worker_env(base_settings), stdout=subprocess.DEVNULL, stderr=err)
        rec.pid = first.pid
        try:
            rc = first.wait(90)
        finally:
            first.kill()
    assert rc == -signal.SIGKILL, f"exit {rc}, not killed by the receiver:\n{log1.read_text()[-4000:]}"
    assert rec.killed is not None and len(rec.accepted()) == 10

    second = run_act(base_settings, "--webhook", url, "--exit-when-idle", "3", "--state", state, verbose=True)

    accepted = rec.accepted()
    assert set(accepted) == keys, f"missing: {sorted(keys - set(accepted))[:5]}"
    # Only the key answered just before the SIGKILL can have been posted twice: the consumer got its 2xx but
    # may have died before the ledger recorded it. Every other key reached the webhook exactly once.
    repeated = {k: n for k, n in accepted.items() if n > 1}
    assert set(repeated) <= {rec.killed} and all(n == 2 for n in repeated.values()), (repeated, rec.killed)
    # ... and a repeat is byte-identical with the same Idempotency-Key, so the receiver can drop it.
    for key in repeated:
        assert len({body for _, k, body, s in rec.requests if k == key and s == 200}) == 1
    applied = {k for _, k, _, s in rec.requests if s == 200}  # what a receiver deduplicating by the header applies
    assert len(applied) == len(triggers)
    for path, key, body, _ in rec.requests:
        assert path == "/triggers" and decode_trigger(body).idempotency_key == key
    # A 503 was retried, and the key was not marked done before the 2xx.
    for key in rec.fail_first_of:
        assert [s for _, k, _, s in rec.requests if k == key][:2] == [503, 200]
    st = second.stats
    # The restart re-reads what was not committed: what the ledger holds is skipped, the rest is acted on.
    assert st["acted"] == len(triggers) - 10 + len(repeated) and st["acted"] + st["already_done"] == st["messages"], st
    assert "s3cret-pw" not in second.stderr and "s3cret-pw" not in log1.read_text()
    assert "http://***@127.0.0.1" in second.stderr


def test_a_key_is_not_done_until_the_webhook_says_2xx_even_across_a_stop(base_settings: Settings, tmp_path: Path,
                                                                        receiver: tuple[Receiver, str]) -> None:
    rec, url = receiver
    rec.down = True
    now = time.time_ns()
    triggers = [trig("scale_up", "serving", f"svc-{i}", now + i) for i in range(3)]
    publish(base_settings, *triggers)
    state = tmp_path / "act.sqlite"
    log1 = tmp_path / "first.log"
    with log1.open("w") as err:
        first = subprocess.Popen(act_cmd("--webhook", url, "--from-beginning", "--state", str(state)),
                                 env=worker_env(base_settings), stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while len(rec.requests) < 2 and time.monotonic() < deadline and first.poll() is None:
                time.sleep(0.1)
            assert len(rec.requests) >= 2, log1.read_text()[-4000:]
            first.send_signal(signal.SIGTERM)  # in the middle of the backoff: it stops without waiting it out
            rc = first.wait(30)
        finally:
            first.kill()
    text = log1.read_text()
    assert rc == 0, text[-4000:]
    assert "retrying in" in text and "the key is not marked done" in text
    stats = json.loads([ln for ln in text.splitlines() if ln.startswith('{"event":"stopped"')][-1])
    assert stats["acted"] == 0 and stats["refused"] == 0, stats
    with ActLedger(state, "live") as ledger:
        assert len(ledger) == 0
    # One trigger at a time: the consumer kept retrying the first it met and went no further.
    assert len({k for _, k, _, _ in rec.requests}) == 1, rec.requests

    rec.down = False
    second = run_act(base_settings, "--webhook", url, "--exit-when-idle", "3", "--state", str(state))
    assert rec.accepted() == {t.idempotency_key: 1 for t in triggers}, rec.requests
    assert second.stats["acted"] == 3


# --- exec --------------------------------------------------------------------------------------------------------

def test_exec_runs_kubectl_once_per_key_with_an_argument_list(base_settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    flaky = tmp_path / "failed-once"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        f"pathlib.Path({str(calls)!r}).open('a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"flaky = pathlib.Path({str(flaky)!r})\n"
        "if 'deployment/etl' in sys.argv and not flaky.exists():\n"
        "    flaky.touch()\n"
        "    sys.exit('error: the server is currently unable to handle the request')\n"
        "print('deployment.apps scaled')\n")
    kubectl.chmod(0o755)
    now = time.time_ns()
    up = trig("scale_up", "serving", "chat", now, current=4, desired=6)
    down = trig("scale_down", "batch", "etl", now + 1, current=6, desired=2)
    rebalance = trig("rebalance", "ml", "trainer", now + 2, current=8, desired=8)
    evil = trig("scale_up", "serving", "x$(touch pwned)", now + 3)
    publish(base_settings, up, down, rebalance, evil, up)
    args = ("--exec", "--kubectl", str(kubectl), "--exit-when-idle", "3", "--state", str(tmp_path / "act.sqlite"))
    first = run_act(base_settings, *args, "--from-beginning")
    got = [json.loads(ln) for ln in calls.read_text().splitlines()]
    assert sorted(map(tuple, got)) == sorted([
        ("scale", "deployment/chat", "--namespace", "serving", "--replicas=6"),
        ("scale", "deployment/etl", "--namespace", "batch", "--replicas=2"),  # failed once, retried
        ("scale", "deployment/etl", "--namespace", "batch", "--replicas=2"),
        ("rollout", "restart", "deployment/trainer", "--namespace", "ml"),
    ]), got
    assert (first.stats["acted"], first.stats["refused"], first.stats["already_done"]) == (3, 1, 1), first.stats
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    assert first.lines == []  # --exec prints no dry-run lines
    publish(base_settings, down, rebalance)
    second = run_act(base_settings, *args)
    assert len(calls.read_text().splitlines()) == 4 and second.stats["already_done"] == 2, second.stats
