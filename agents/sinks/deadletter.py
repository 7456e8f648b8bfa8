"""The dead-letter topic: the original bytes, where they came from and why they were refused.

Header names follow one scheme so a consumer can replay or count rejects without
parsing the value, which stays byte-for-byte what the producer sent.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agents.kafka.producer import SampleProducer
from schemas.records import Reject

MAX_INDICES = 64


class DeadLetter:
    """Sends rejects to ``flopwatch.dlq`` and counts them by reason."""

    def __init__(self, producer: SampleProducer, topic: str) -> None:
        self._producer = producer
        self.topic = topic
        self.counts: Counter[str] = Counter()

    def send(self, reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             headers: Any = (), indices: list[int] | None = None) -> None:
        out = [(k, v) for k, v in headers or () if not k.startswith("flopwatch.")]
        out += [
            ("flopwatch.reason", reject.reason.value.encode()),
            ("flopwatch.detail", reject.detail[:1000].encode()),
            ("flopwatch.topic", topic.encode()),
            ("flopwatch.partition", str(partition).encode()),
            ("flopwatch.offset", str(offset).encode()),
        ]
        if indices is not None:
            # Only these samples of a batch were refused; the others are in frames.
            out.append(("flopwatch.indices", ",".join(map(str, indices[:MAX_INDICES])).encode()))
            out.append(("flopwatch.rejected", str(len(indices)).encode()))
        self.counts[reject.reason.value] += 1 if indices is None else len(indices)
        self._producer.send(self.topic, value or b"", key, out)

    def flush(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        self._producer.close()
