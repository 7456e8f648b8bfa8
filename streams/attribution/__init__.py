"""Why an alert fired (seed 000 §4.4): a ranked list of likely causes from what happened around it on the same
node, pod and GPU: Kubernetes events, other detections, label changes, and the aligned series that changed
first and move with the symptom (lagged cross-correlation and a shift test, by scipy).

Bounded: a fixed window of aligned history per GPU, a fixed number of recent events and detections per node.

Imports: ``schemas``, numpy, scipy.
"""
