"""Policy files: strict TOML tables onto frozen parameter dataclasses, shared by the decision and leak policies.

Imports: nothing of ours.
"""
