"""``flopwatch alerts forward`` between a real Kafka and a real Prometheus Alertmanager (deploy/alertmanager.sh).

Alerts go in with the real producer; what Alertmanager holds is read back through its API,
``GET /api/v2/alerts``, which lists alerts that have not ended (a resolved one drops out).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agents.kafka.producer import SampleProducer
from agents.kafka.topics import ALERTS
from agents.settings import Settings
from schemas.alerts import Alert, alert_key, encode_alert, make_alert
from tests.integration.helpers import worker_env

pytestmark = pytest.mark.integration

S = 10**9
RESEND_S, ENDS_AFTER_S = 1.0, 4.0
T = TypeVar("T")


def alertmanager_url(service_env: dict[str, str]) -> str:
    url = service_env.get("FLOPWATCH_ALERTMANAGER_URL", "")
    assert url, "FLOPWATCH_ALERTMANAGER_URL is not set: start the services with deploy/services.sh start"
    return url


def active(url: str, node: str) -> dict[str, dict[str, Any]]:
    """The alerts Alertmanager holds for ``node`` (not ended), by GPU."""
    query = urllib.parse.urlencode({"filter": f'node="{node}"'})
    with urllib.request.urlopen(f"{url}/api/v2/alerts?{query}", timeout=10) as resp:
        return {a["labels"]["gpu"]: a for a in json.loads(resp.read())}


def ns(rfc3339: str) -> int:
    """Alertmanager's timestamps (milliseconds) as nanoseconds."""
    return round(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000) * 1_000_000


def wait_for(probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got is not None:
            return got
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s")


def publish(settings: Settings, *messages: Alert | bytes) -> None:
    producer = SampleProducer(settings)
    for m in messages:
        if isinstance(m, Alert):
            producer.send(settings.topic_prefix + ALERTS, encode_alert(m), key=alert_key(m))
        else:
            producer.send(settings.topic_prefix + ALERTS, m, key=b"junk")
    producer.close()


class Forwarder:
    """``flopwatch alerts forward`` as a subprocess with short re-send and endsAt horizon."""

    def __init__(self, settings: Settings, url: str, log: Path, *extra: str) -> None:
        self.log = log
        self._err = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents.cli.main", "alerts", "forward", "--alertmanager", url,
             "--resend-s", str(RESEND_S), "--ends-after-s", str(ENDS_AFTER_S), *extra],
            env=worker_env(settings), stdout=subprocess.PIPE, stderr=self._err, text=True)

    def running(self) -> None:
        """Fail at once, with its log, if it exited."""
        assert self.proc.poll() is None, f"the forwarder exited ({self.proc.returncode}):\n{self.log.read_text()[-4000:]}"

    def stop(self) -> dict[str, Any]:
        """SIGTERM; its final stats. It is killed, never left behind, if it does not stop."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        finally:
            self.proc.kill()
            self._err.close()
        assert self.proc.returncode == 0, self.log.read_text()[-4000:]
        stats: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return stats


def test_forwarder_fires_resends_resolves_and_restarts_without_resurrection(
        base_settings: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    url = alertmanager_url(service_env)
    node = f"node-{base_settings.group_id}"  # unique per test: the filter sees only this test's alerts
    onset = time.time_ns() - 30 * S
    gpus = {g: make_alert("util_spike", "warning", node, g, value=99.2, threshold=95.0, baseline=41.0,
                          onset_ts_ns=onset + i * S, ts_ns=onset + i * S + S // 5,
                          workload=f"wl-{base_settings.group_id}", namespace="ml",
                          evidence={"window_ms": 1000, "above_ms": 200})
            for i, g in enumerate(("0", "1"))}
    publish(base_settings, gpus["0"], b"{not json", gpus["1"], b'{"v": 3}')

    first = Forwarder(base_settings, url, tmp_path / "first.log")
    try:
        def both() -> dict[str, dict[str, Any]] | None:
            first.running()
            got = active(url, node)
            return got if len(got) == 2 else None

        seen = wait_for(both, "two firing alerts")
        for g, a in gpus.items():
            assert seen[g]["labels"] == {"alertname": "util_spike", "severity": "warning", "node": node, "gpu": g,
                                         "alert_id": a.id, "workload": a.workload, "namespace": "ml"}
            assert ns(seen[g]["startsAt"]) == a.onset_ts_ns // 1_000_000 * 1_000_000
            assert seen[g]["status"]["state"] == "active"
            assert seen[g]["annotations"]["value"] == "99.2" and seen[g]["annotations"]["baseline"] == "41.0"

        # Re-sending keeps a firing alert active past the endsAt it was first posted with.
        first_end = ns(seen["0"]["endsAt"])
        assert first_end <= time.time_ns() + int(ENDS_AFTER_S * S) + S
        time.sleep(max(0.0, (first_end - time.time_ns()) / S) + 1.0)
        later = active(url, node)
        assert "0" in later and ns(later["0"]["endsAt"]) > first_end

        # A resolution ends the alert at once: long before the endsAt of its last re-send.
        end_before = ns(active(url, node)["1"]["endsAt"])
        publish(base_settings, gpus["1"].resolved(time.time_ns(), value=61.0))
        wait_for(lambda: True if "1" not in active(url, node) else None, "the resolution", timeout_s=10)
        assert time.time_ns() < end_before, "the alert only timed out: the resolution was not posted"
        assert set(active(url, node)) == {"0"}
    finally:
        stats = first.stop()
    assert stats["bad"] == 2 and stats["bad_reasons"] == {"malformed_json": 1, "unknown_version": 1}, stats
    assert (stats["firing"], stats["pending_resolutions"], stats["caught_up"]) == (1, 0, True), stats

    # A detector replays the firing message of the resolved episode; a fresh forwarder (this time in a
    # consumer group, which rebuilds on assignment) reads everything again.
    publish(base_settings, gpus["1"])
    restart_ns = time.time_ns()
    second = Forwarder(base_settings, url, tmp_path / "second.log", "--group", f"{base_settings.group_id}-alerts")
    try:
        def resent_by_second() -> dict[str, Any] | None:
            # An endsAt beyond anything the first forwarder can have posted.
            second.running()
            got = active(url, node).get("0")
            return got if got and ns(got["endsAt"]) > restart_ns + int(ENDS_AFTER_S * S) else None

        resent = wait_for(resent_by_second, "a re-send by the restarted forwarder")
        assert ns(resent["startsAt"]) == gpus["0"].onset_ts_ns // 1_000_000 * 1_000_000
        for _ in range(int(3 * RESEND_S / 0.2)):  # three re-send periods: the resolved one stays resolved
            assert set(active(url, node)) == {"0"}
            time.sleep(0.2)
    finally:
        stats = second.stop()
    assert (stats["firing"], stats["pending_resolutions"], stats["caught_up"]) == (1, 0, True), stats
