"""Logging of the worker's libraries: what a person should see, once, at the right level."""

from __future__ import annotations

import logging
import urllib.parse

from aiokafka import errors as kafka_errors

log = logging.getLogger("flopwatch")

# Errors a consumer meets while the broker's group coordinator starts up: aiokafka logs each
# retry at ERROR, although it only waits and tries again.
_COORDINATOR_STARTING = (kafka_errors.CoordinatorNotAvailableError, kafka_errors.CoordinatorLoadInProgressError,
                         kafka_errors.NotCoordinatorError)


class CoordinatorWait(logging.Filter):
    """Turns aiokafka's retried "Group Coordinator Request failed" errors into one INFO line.

    The first one is said at INFO on flopwatch's logger; the retries are dropped. Any other
    record passes untouched, so real errors stay visible.
    """

    def __init__(self) -> None:
        super().__init__()
        self._told = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.msg == "Group Coordinator Request failed: %s" and record.args
                and isinstance(record.args, tuple) and isinstance(record.args[0], _COORDINATOR_STARTING)):
            return True
        if not self._told:
            self._told = True
            log.info("Kafka's group coordinator is not ready yet (%s); waiting for it, as usual right after "
                     "a broker starts", type(record.args[0]).__name__)
        return False


def quiet_kafka_startup() -> None:
    """Install the filter on aiokafka's coordinator logger (idempotent)."""
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    if not any(isinstance(f, CoordinatorWait) for f in logger.filters):
        logger.addFilter(CoordinatorWait())


def redact(url: str) -> str:
    """The URL without its credentials, for logs.

    >>> redact("http://am:s3cret@alerts.example:9093/x"), redact("http://127.0.0.1:9094")
    ('http://***@alerts.example:9093/x', 'http://127.0.0.1:9094')
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
