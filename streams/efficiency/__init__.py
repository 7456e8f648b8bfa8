"""What a frame's compute is worth: achieved TFLOP/s, FLOPS/Watt, cost per TFLOP/s, energy and cost.

Imports: ``schemas``, ``streams.align`` (frames), numpy.
"""
