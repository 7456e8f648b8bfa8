"""Where outputs go: ClickHouse (embedded chDB or a server), the frame store, the dead-letter topic, frames out,
Alertmanager.

Imports: ``schemas``, ``streams``, ``agents.runtime``, ``agents.kafka``.
"""
