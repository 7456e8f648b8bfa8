"""What every service shares at run time: clocks, backoff, logging, GC tuning, the entry-point helper (settings,
signals, JSON summary) and the partition runtime of the Faust agents.

Imports: ``schemas``, ``streams``, ``agents.kafka``, ``agents.settings``.
"""
