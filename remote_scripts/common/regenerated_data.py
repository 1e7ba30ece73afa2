"""The regenerate stage's output beside the data it was made from: OUTPUT (the chat rows with the
verifier's replies) and OUTPUT.meta.json, which records the source's SHA-256 (regenerate.py
writes it; prepare_data.py reads OUTPUT in place of the data only when that hash matches).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def meta_file(output: Path) -> Path:
    return output.with_name(output.name + ".meta.json")
