"""Where the money leaks: seven leak and trap detectors on closed frames (seed 000 §2), each with the
money it burns.

Every detector is a small deterministic object fed one frame per tick (``streams.leaks.bank``
holds them per GPU and node); thresholds and windows come from ``streams.leaks.params``, which
a policy file's ``[leaks.<rule>]`` tables override.

Imports: ``schemas``, ``streams.policy``, numpy, scipy.
"""
