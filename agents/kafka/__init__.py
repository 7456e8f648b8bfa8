"""Kafka plumbing: topic names and client configuration, topic administration, the producer client.

Imports: ``schemas``, ``agents.settings``.
"""
