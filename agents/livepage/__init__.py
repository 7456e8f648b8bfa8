"""The live web page the worker serves beside ``/metrics`` (``/live``): its bounded state fed by the agents,
its routes on Faust's web server, the heatmap's SQL, and the page's static files with the vendored uPlot.

Imports: ``schemas``, ``streams``, ``agents.sinks``.
"""
