"""``flopwatch act``'s pure parts: the commands it prints or runs, the name checks, the ledger of done keys."""

from __future__ import annotations

import doctest
import importlib
import sqlite3
from pathlib import Path

import pytest

from agents.act.commands import UnsafeName, check_names, dry_run_line, kubectl_args, namespace_error, workload_error
from agents.act.ledger import ActLedger, Entry, LedgerError
from agents.act.sinks import header_safe, retryable
from schemas.triggers import Action, Trigger, make_trigger

TS = 1_796_200_344_000_000_000


def trigger(action: Action = "scale_up", namespace: str = "serving", workload: str = "chat", *, ts_ns: int = TS,
            current: int = 4, desired: int = 6, reverses: str | None = None) -> Trigger:
    return make_trigger(action, namespace, workload, "inference", ts_ns=ts_ns, current=current, desired=desired,
                        reasons=("qps",), evidence={"qps": {"value": 1050.0, "threshold": 800.0, "window_s": 30.0}},
                        reverses=reverses)


def entry(key: str, ts_ns: int = TS, outcome: str = "printed", offset: int = 0) -> Entry:
    return Entry(key, ts_ns, "id", "digest", "scale_up", outcome, "", ts_ns + 1, "flopwatch.triggers", 0, offset)


# --- commands --------------------------------------------------------------------------------------------------

def test_scale_up_and_down_set_the_desired_replicas() -> None:
    assert kubectl_args(trigger()) == ["scale", "deployment/chat", "--namespace", "serving", "--replicas=6"]
    down = trigger("scale_down", current=6, desired=2)
    assert dry_run_line(down) == ('kubectl scale deployment/chat --namespace serving --replicas=2  '
                                  f'# scale_down idempotency_key="serving/chat/scale_down/{TS}"')


def test_a_rollback_scales_back_and_names_the_decision_it_reverses() -> None:
    down = trigger("scale_down", current=6, desired=2)
    back = trigger("rollback", ts_ns=TS + 30 * 10**9, current=2, desired=6, reverses=down.id)
    line = dry_run_line(back)
    assert line.startswith("kubectl scale deployment/chat --namespace serving --replicas=6  # ")
    assert f"rollback of decision {down.id}" in line and back.idempotency_key in line


def test_a_rebalance_restarts_the_rollout_and_keeps_the_count() -> None:
    t = trigger("rebalance", "ml", "trainer.v2", current=8, desired=8)
    assert kubectl_args(t) == ["rollout", "restart", "deployment/trainer.v2", "--namespace", "ml"]
    assert dry_run_line(t).startswith("kubectl rollout restart deployment/trainer.v2 --namespace ml  # rebalance ")


def test_the_dry_run_line_is_one_line_whatever_the_key_holds() -> None:
    t = trigger()
    odd = Trigger(**{**{f: getattr(t, f) for f in Trigger.__dataclass_fields__},
                     "idempotency_key": 'k"\n\rkubectl delete namespace prod\u2028'})
    line = dry_run_line(odd)
    assert line.splitlines() == [line]
    assert line.endswith('idempotency_key="k\\"\\n\\rkubectl delete namespace prod\\u2028"')


def test_a_custom_kubectl_path_is_quoted() -> None:
    assert dry_run_line(trigger(), kubectl="/opt/k 8s/kubectl").startswith("'/opt/k 8s/kubectl' scale ")


# --- names -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["serving", "a", "ml-team-2", "0x", "a" * 63])
def test_valid_namespaces(name: str) -> None:
    assert namespace_error(name) is None


@pytest.mark.parametrize("name", ["", "Serving", "-ml", "ml-", "ml.team", "ml_team", "a" * 64, "ml team", "ml;ls",
                                  "ml\n", "$(id)", "mł"])
def test_invalid_namespaces(name: str) -> None:
    assert namespace_error(name) is not None


@pytest.mark.parametrize("name", ["chat", "chat-v2", "chat.v2.eu", "a" * 253, "0"])
def test_valid_workloads(name: str) -> None:
    assert workload_error(name) is None


@pytest.mark.parametrize("name", ["", "Chat", "chat.", ".chat", "chat..v2", "chat-.v2", "a" * 254, "chat v2",
                                  "chat;rm -rf /", "chat`id`", "../etc", "chat\n--all", "--all"])
def test_invalid_workloads(name: str) -> None:
    assert workload_error(name) is not None


def test_an_unsafe_name_never_reaches_a_command() -> None:
    for t in (trigger(namespace="prod --all-namespaces"), trigger(workload="chat --replicas=0"),
              trigger(namespace="Prod")):
        with pytest.raises(UnsafeName):
            check_names(t)
        with pytest.raises(UnsafeName):
            kubectl_args(t)
        with pytest.raises(UnsafeName):
            dry_run_line(t)
    with pytest.raises(UnsafeName, match=r"^namespace 'Prod' is not an RFC 1123 label"):
        check_names(trigger(namespace="Prod"))
    with pytest.raises(UnsafeName, match=r"^workload 'chat;x' is not an RFC 1123 subdomain"):
        check_names(trigger(workload="chat;x"))


# --- webhook rules ---------------------------------------------------------------------------------------------

def test_what_the_webhook_retries() -> None:
    assert all(retryable(s) for s in (None, 500, 502, 503, 504, 408, 425, 429))
    assert not any(retryable(s) for s in (400, 401, 403, 404, 409, 422, 301, 302, 307))


def test_idempotency_keys_that_cannot_be_a_header() -> None:
    assert header_safe(f"serving/chat/scale_up/{TS}") and header_safe("a b~")
    assert not any(header_safe(k) for k in ("", "a\nb", "a\rb", "ключ", "a\x00b", "tab\there"))


# --- ledger ----------------------------------------------------------------------------------------------------

def test_a_recorded_key_is_found_and_others_are_not(tmp_path: Path) -> None:
    with ActLedger(tmp_path / "act.sqlite", "live") as ledger:
        assert ledger.lookup("a") is None and len(ledger) == 0
        ledger.record(entry("a", outcome="posted", offset=7))
        got = ledger.lookup("a")
        assert got == entry("a", outcome="posted", offset=7)
        assert ledger.lookup("b") is None and len(ledger) == 1


def test_the_ledger_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state" / "act.sqlite"  # the folder is made
    with ActLedger(path, "live") as ledger:
        for i in range(3):
            ledger.record(entry(f"k{i}", offset=i))
    with ActLedger(path, "live") as again:
        assert len(again) == 3
        assert [again.lookup(f"k{i}") for i in range(3)] == [entry(f"k{i}", offset=i) for i in range(3)]
    # What is on disk is plain SQLite in WAL mode, readable by any tool.
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT count(*) FROM done").fetchone()[0] == 3
    db.close()


def test_a_dry_run_does_not_hide_a_key_from_a_live_run(tmp_path: Path) -> None:
    path = tmp_path / "act.sqlite"
    with ActLedger(path, "dry-run") as preview:
        preview.record(entry("a"))
    with ActLedger(path, "live") as live:
        assert live.lookup("a") is None and len(live) == 0
        live.record(entry("a", outcome="posted"))
    with ActLedger(path, "dry-run") as preview:
        got = preview.lookup("a")
        assert got is not None and got.outcome == "printed"


def test_purge_drops_keys_older_than_the_horizon_by_trigger_time(tmp_path: Path) -> None:
    with ActLedger(tmp_path / "act.sqlite", "live") as ledger:
        for i in range(5):
            ledger.record(entry(f"k{i}", ts_ns=TS + i))
        assert ledger.purge(TS + 2) == 2
        assert [ledger.lookup(f"k{i}") is not None for i in range(5)] == [False, False, True, True, True]
        assert ledger.purge(TS + 2) == 0
    with ActLedger(tmp_path / "act.sqlite", "live") as again:
        assert len(again) == 3


def test_recording_a_key_again_keeps_one_row(tmp_path: Path) -> None:
    with ActLedger(tmp_path / "act.sqlite", "live") as ledger:
        ledger.record(entry("a", outcome="failed"))
        ledger.record(entry("a", outcome="posted"))
        assert len(ledger) == 1 and ledger.lookup("a") == entry("a", outcome="posted")


def test_one_process_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "act.sqlite"
    with ActLedger(path, "live"), pytest.raises(LedgerError, match="in use by another process"):
        ActLedger(path, "live")
    ActLedger(path, "live").close()  # released on close


def test_a_ledger_of_an_unknown_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "act.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=9")
    db.close()
    with pytest.raises(LedgerError, match="layout 9"):
        ActLedger(path, "live")


def test_a_ledger_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "act.sqlite"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(LedgerError, match="cannot open the ledger"):
        ActLedger(path, "live")


@pytest.mark.parametrize("name", ["agents.act.commands", "agents.act.ledger", "agents.act.sinks"])
def test_doctests_pass(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), verbose=False, report=True)
    assert result.attempted >= 1 and result.failed == 0
