"""Event-time alignment: the grid and its contract, watermark holds, cell aggregation, clock domains and their
correction.

Imports: ``schemas`` and the standard library, numpy; nothing else of ``streams``.
"""
