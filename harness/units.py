"""Sizes as a person reads them: one format for every line harness prints."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (B, KiB, MiB, GiB, TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
