"""The simulated cluster: physics, per-source signal generators, labelled scenarios and their playing.

Imports: ``schemas``, numpy and scipy; nothing else of ``streams``.
"""
