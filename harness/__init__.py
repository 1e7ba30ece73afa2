"""harness: drive EAGLE-3 draft-model training on a remote GPU box from a laptop.

The laptop side never imports torch; heavy modules (the SSH client library, rich) are imported lazily
so that `harness --help` stays fast.
"""

__version__ = "0.1.0"
