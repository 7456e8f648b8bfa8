"""Test doubles of external libraries (pynvml), for tests on machines without the real thing."""
