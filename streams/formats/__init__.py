"""Pure parsers of what producers read: nvidia-smi CSV, NVML fields, Kubernetes objects, pod labels.

Imports: ``schemas`` and the standard library.
"""
