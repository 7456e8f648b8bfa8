"""What a frame's compute is worth: achieved TFLOP/s, FLOPS/Watt, cost per TFLOP/s, energy and cost; and the
enricher that fills a closed batch's derived columns (these and the L1 spike peaks).

Imports: ``schemas``, ``streams.align`` (frames), ``streams.detect`` (the spike engine, in ``enrich``), numpy.
"""
