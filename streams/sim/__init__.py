"""The simulated cluster: physics, per-source signal generators, labelled scenarios and their playing.

Imports: ``schemas`` and numpy; nothing else of ``streams``.
"""
