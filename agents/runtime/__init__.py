"""What every service shares at run time: clocks, backoff, logging, GC tuning, and the partition runtime of the
Faust agents.

Imports: ``schemas``, ``streams``, ``agents.kafka``, ``agents.settings``.
"""
