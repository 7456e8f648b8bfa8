"""ensure_topics returns once the topics it created are in the cluster's metadata, not merely acknowledged."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agents.kafka import admin as topic_admin
from agents.kafka.admin import TopicLayoutError


class _Admin:
    """Metadata that learns of the topics after ``late`` listings, as a broker does after the controller."""

    def __init__(self, topics: list[str], late: int) -> None:
        self.topics, self.late, self.listings = topics, late, 0

    def list_topics(self, timeout: float) -> Any:
        self.listings += 1
        ready = self.listings > self.late
        part = SimpleNamespace(replicas=[1])
        return SimpleNamespace(topics={t: SimpleNamespace(error=None, partitions={0: part} if ready else {})
                                       for t in self.topics[:1 if not ready else None]})


def test_waits_until_every_created_topic_is_listed_with_its_partitions() -> None:
    fake = _Admin(["a", "b"], late=3)
    meta = topic_admin._until_listed(fake, ["a", "b"], timeout_s=5.0)  # type: ignore[arg-type]
    assert fake.listings == 4 and set(meta.topics) == {"a", "b"}


def test_says_which_topic_never_showed() -> None:
    with pytest.raises(TopicLayoutError, match=r"2 topic\(s\) created but not in the cluster's metadata after 0.3 s"):
        topic_admin._until_listed(_Admin(["a", "b"], late=10**6), ["a", "b"], timeout_s=0.3)  # type: ignore[arg-type]
