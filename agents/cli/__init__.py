"""The ``flopwatch`` command line and the demo.

Imports: anything in ``agents``; nothing imports it but the entry point.
"""
