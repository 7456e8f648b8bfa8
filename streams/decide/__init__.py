"""The decision engine: policy, rules and gates, event-time windows, and the closed-loop decision scenarios.

Imports: ``schemas``, ``streams.detect`` (spike rule, workload tap) and ``streams.sim`` (scenarios only).
"""
