"""The decision engine: policy, rules and gates, event-time windows, and the closed-loop decision scenarios.

Imports: ``schemas`` and ``streams.detect`` (the spike rule, the workload tap).
"""
