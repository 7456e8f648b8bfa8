"""Detectors on closed frames and raw samples: efficiency drift, L1 spikes, River's change detectors behind our
Protocol, and the per-workload tap.

Imports: ``schemas``, ``streams.align``, numpy, river (only in ``change``).
"""
