"""The detection service: the Faust agent from ``flopwatch.frames`` to alerts.

Imports: ``schemas``, ``streams``, ``agents.runtime``, ``agents.kafka``, ``agents.sinks``.
"""
