"""The worker's log: aiokafka's coordinator start-up retries become one INFO line; real errors stay."""

from __future__ import annotations

import logging

import pytest
from aiokafka import errors as kafka_errors

from agents.runtime.logs import quiet_kafka_startup


def _record(err: Exception, msg: str = "Group Coordinator Request failed: %s") -> None:
    logging.getLogger("aiokafka.consumer.group_coordinator").error(msg, err)


def test_coordinator_start_up_is_said_once_at_info_and_real_errors_stay(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    saved = list(logger.filters)
    try:
        quiet_kafka_startup()
        quiet_kafka_startup()  # idempotent: one filter
        with caplog.at_level(logging.INFO):
            for _ in range(5):
                _record(kafka_errors.CoordinatorNotAvailableError())
            _record(kafka_errors.CoordinatorLoadInProgressError())
            _record(kafka_errors.GroupAuthorizationFailedError())  # not a start-up wait
            _record(kafka_errors.CoordinatorNotAvailableError(), "Heartbeat failed: %r")
        got = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        assert len(got) == 3, got
        assert got[0][:2] == ("flopwatch", "INFO") and "not ready yet" in got[0][2]
        assert got[1][:2] == ("aiokafka.consumer.group_coordinator", "ERROR") and "Authorization" in got[1][2]
        assert got[2][1] == "ERROR" and got[2][2].startswith("Heartbeat failed")
    finally:
        logger.filters[:] = saved
