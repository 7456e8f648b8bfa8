"""Producers: the NVML and Kubernetes collectors, file replay, the producer SDK and the simulator's publisher.

Imports: ``schemas``, ``streams``, ``agents.runtime``, ``agents.kafka``.
"""
