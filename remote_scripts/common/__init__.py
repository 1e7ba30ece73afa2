"""Shared pieces of the GPU-side stages: the events seam (events.py) and the verifier guards
(verifier.py). Nothing here imports `harness`."""
