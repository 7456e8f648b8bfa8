"""Brokers and servers a test starts for itself, on its own ports and directories, beside the session's.

A test that stops, kills or restarts a service does it to one of these, never to the session's broker or
clickhouse-server: the tests running beside it on the other xdist worker (tests/conftest.py) use those.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.agents.test_web import free_port
from tests.integration.conftest import ROOT


def _run(script: str, args: tuple[str, ...], env: dict[str, str], logs: list[Path]) -> str:
    out = subprocess.run([str(ROOT / "deploy" / script), *args], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        # The script says why on stderr and the service's logs say the rest: a CI failure must carry both.
        tails = "".join(f"\n--- {log} (tail)\n" + "".join(log.read_text(errors="replace").splitlines(True)[-30:])
                        for log in logs if log.exists())
        pytest.fail(f"deploy/{script} {' '.join(args)} exited {out.returncode}\n{out.stderr}{tails}", pytrace=False)
    return out.stdout.strip()


class OwnKafka:
    """``deploy/kafka.sh start`` with its state in ``state``: one broker on ``port`` (its controller one above), or
    with ``brokers`` > 1 a cluster (``--brokers N``) on ``port``, ``port + 2``, ..."""

    def __init__(self, state: Path, port: int, brokers: int = 1) -> None:
        self.state, self.brokers = state, brokers
        # JVMs starting at once on a loaded 2-core CI machine: a broker's own deadline of 180 s, not 90.
        self.env = {k: v for k, v in os.environ.items() if k != "FLOPWATCH_KAFKA_BOOTSTRAP"} | {
            "FLOPWATCH_KAFKA_PORT": str(port), "FLOPWATCH_KAFKA_CONTROLLER_PORT": str(port + 1),
            "FLOPWATCH_KAFKA_HEAP": "384m", "FLOPWATCH_KAFKA_START_TIMEOUT": "180"}
        if brokers > 1:
            self.env["FLOPWATCH_KAFKA_CLUSTER_DIR"] = str(state)
            self._flag: tuple[str, ...] = ("--cluster",)
            self._logs = "n*/logs/server.log"
        else:  # kafka.sh's single broker, in a state directory of its own (not the session broker's)
            self.env["FLOPWATCH_STATE_DIR"] = str(state)
            self._flag = ()
            self._logs = "kafka/logs/server.log"
            # The classpath the session's broker resolved, instead of resolving the jars again.
            dist = Path(os.environ.get("FLOPWATCH_STATE_DIR", ROOT / ".flopwatch")) / "kafka" / "dist"
            if dist.is_dir():
                (state / "kafka").mkdir(parents=True, exist_ok=True)
                (state / "kafka" / "dist").symlink_to(dist, target_is_directory=True)
        self.bootstrap = ""

    def run(self, *args: str) -> str:
        return _run("kafka.sh", args, self.env, sorted(self.state.glob(self._logs)))

    def start(self) -> None:
        """Start whichever broker is down (all of them the first time)."""
        self.bootstrap = self.run("start", *(("--brokers", str(self.brokers)) if self.brokers > 1 else ())
                                  ).splitlines()[-1]

    def kill(self, broker: int) -> None:
        self.run("kill", str(broker))

    def stop(self) -> None:
        self.run("stop", *self._flag)

    def close(self) -> None:
        """Stop every broker, whatever state the test left them in."""
        subprocess.run([str(ROOT / "deploy/kafka.sh"), "stop", *self._flag], env=self.env, check=False, timeout=180)


class OwnClickHouse:
    """``deploy/clickhouse.sh`` with its state in ``state`` and free ports: the same server and users as the
    session's, ``port`` its native protocol."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.port = free_port()
        self.env = dict(os.environ) | {
            "FLOPWATCH_STATE_DIR": str(state), "FLOPWATCH_CLICKHOUSE_PORT": str(self.port),
            "FLOPWATCH_CLICKHOUSE_HTTP_PORT": str(free_port()), "FLOPWATCH_CLICKHOUSE_SECURE_PORT": str(free_port())}

    def run(self, action: str) -> None:
        _run("clickhouse.sh", (action,), self.env, [self.state / "clickhouse/logs/clickhouse-server.err.log",
                                                    self.state / "clickhouse/logs/stdout.log"])

    def close(self) -> None:
        """Stop the server, whatever state the test left it in (a failing stop must not hide the test's error)."""
        subprocess.run([str(ROOT / "deploy/clickhouse.sh"), "stop"], env=self.env, check=False, timeout=180)
