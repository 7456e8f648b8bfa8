"""``flopwatch act``: an example consumer of ``flopwatch.triggers`` that acts once per idempotency key.

Imports: ``schemas``, ``agents.runtime``, ``agents.kafka``.
"""
