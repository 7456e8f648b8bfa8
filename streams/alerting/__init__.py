"""Alerts after detection: the book of which episodes are firing or resolved, when each is posted again, and the
Alertmanager payload of each (the forwarder in ``agents.sinks.alertmanager`` does the posting).

Imports: ``schemas`` and the standard library, orjson; nothing else of ``streams``.
"""
