"""The decision service: the Faust agent from per-workload summaries to triggers, and the scale view for KEDA.

Imports: ``schemas``, ``streams``, ``agents.runtime``, ``agents.kafka``, ``agents.sinks``.
"""
