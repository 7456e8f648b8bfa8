"""The ingest service: the batch consumer of the sensor topics, its processing core, clock-domain waits, commits,
positions, the price book file and enrichment.

Imports: ``schemas``, ``streams``, ``agents.runtime``, ``agents.kafka``, ``agents.sinks``.
"""
