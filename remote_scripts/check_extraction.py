"""Inventory of one host's hidden-state files, for the cross-shard check after a sharded extract.

`extract_hidden_states.py` checks its own shard when it ends. This script looks at ALL samples of
the prepared dataset in one host's output directory and reports, as one JSON object on stdout,
which samples have a valid file here, which files are invalid and which name no sample. The
harness runs it on every host of a group and merges the answers (harness/extraction_check.py):
every sample must have exactly one valid file somewhere. Validity and `storage_id`:
docs/architecture/stage-scripts.md, "The stage scripts".

    python remote_scripts/check_extraction.py --prepared outputs/prepared --output outputs/hidden_states
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.hidden_state_files import META_FILE, check_file, hs_path  # noqa: E402

HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
STORAGE_ID_FILE = ".storage_id"


def ranges(indices: list[int]) -> list[list[int]]:
    """[0, 1, 2, 5, 7, 8] -> [[0, 2], [5, 5], [7, 8]] (inclusive; short JSON for long runs)."""
    out: list[list[int]] = []
    for i in sorted(indices):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def storage_id(output: Path) -> str:
    path = output / STORAGE_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    tmp = output / f"{STORAGE_ID_FILE}.tmp-{os.getpid()}"
    tmp.write_text(uuid.uuid4().hex + "\n")
    try:
        os.link(tmp, path)  # atomic create-if-absent: a concurrent checker's id wins, never two ids
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


def inventory(prepared: str, output: Path, num_layers: int | None, hidden: int | None) -> dict:
    from datasets import load_from_disk

    dataset = load_from_disk(prepared)
    dataset.set_format("torch")
    n = len(dataset)
    meta = None
    if (output / META_FILE).exists():
        meta = json.loads((output / META_FILE).read_text())
        num_layers, hidden = len(meta["target_layer_ids"]) + 1, meta["hidden_size"]
    present = {}
    if output.is_dir():
        for entry in os.scandir(output):
            m = HS_NAME.match(entry.name)
            if m:
                present[int(m.group(1))] = entry.name
    valid, invalid = [], {}
    for i in sorted(present):
        if i >= n:
            continue
        why = check_file(hs_path(output, i), dataset[i]["input_ids"].tolist(), num_layers, hidden)
        if why is None:
            valid.append(i)
        else:
            invalid[str(i)] = why
    return {
        "num_samples": n,
        "valid": ranges(valid),
        "invalid": invalid,
        "stray": sorted(name for i, name in present.items() if i >= n),
        "meta": meta,
        "expected": {"num_layers": num_layers, "hidden": hidden},
        "storage_id": storage_id(output) if output.is_dir() else None,
        "output": str(output.resolve()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepared", required=True)
    p.add_argument("--output", required=True, help="the hidden-states directory")
    p.add_argument("--num-layers", type=int, default=None, help="k+1, when this host has no extract_meta.json")
    p.add_argument("--hidden", type=int, default=None)
    a = p.parse_args(argv)
    if not Path(a.prepared).exists():
        print(f"prepared dataset {a.prepared} does not exist", file=sys.stderr)
        return 2
    print(json.dumps(inventory(a.prepared, Path(a.output), a.num_layers, a.hidden)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
