#!/usr/bin/env python3
"""What one GPU session hands the next in a levers study: the replies regenerate made.

A device session ends with its disk, and at 20,000 prompts regenerate alone takes about a third
of one (bench/RESULTS.md). Its artifacts come back in one archive of a few MiB, and the next
session's study (run.py --carried) puts them in its artifact store. The store then reuses one only
where the key is the same: the same verifier, data, flags, code and libraries. Otherwise
regenerate runs again.

The catch: the store identifies a large input file that is not safetensors by size and mtime
(artifact_store.tree_entry). The next session imports the verifier from the carried GGUF again:
the same bytes with another mtime (SmolLM2's tokenizer.json, 3.4 MiB). So the archive lists each
verifier file's SHA-256 and mtime. Where every file here has the same content, the recorded mtimes
are put back and the key is what it was. Where any file differs, nothing is restored.

    python bench/quality/carried.py pack WORKDIR OUT.tgz [--verifier outputs/smollm2-verifier]
        (on the device, each call: writes OUT.tgz only when an artifact was completed since the
        last pack; over 15 MiB, as OUT.tgz.part0, .part1, ... since a call brings back at most
        16 MiB a file: `cat OUT.tgz.part* > OUT.tgz` here)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

STORE = "outputs/artifacts/regenerate"  # the study's artifact store, regenerate's part (artifact_store.Store)
MANIFEST = "carried.json"
PACKED = ".carried-packed.json"  # in the workdir: the keys the last pack held
PART_BYTES = 15 << 20


def log(msg: str) -> None:
    print(f"[carried] {msg}", file=sys.stderr, flush=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stamps(verifier: Path) -> dict[str, dict]:
    """Each file of the verifier directory (as artifact_store.identify walks it): content and mtime."""
    out = {}
    for path in sorted(p for p in verifier.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(verifier).parts)):
        out[str(path.relative_to(verifier))] = {"sha256": file_sha256(path), "mtime_ns": path.stat().st_mtime_ns}
    return out


def complete_keys(work: Path) -> list[str]:
    """The regenerate artifacts whose record is written (a complete artifact, artifact_store.Store)."""
    store = work / STORE
    return sorted(p.stem for p in store.glob("*.json") if (store / p.stem).is_dir()) if store.is_dir() else []


def pack(work: Path, out: Path, verifier: str) -> list[Path]:
    """The complete regenerate artifacts and the verifier's stamps in `out` (or its parts), when
    the set of complete artifacts changed since the last pack; else nothing (returns the files)."""
    keys = complete_keys(work)
    packed = work / PACKED
    if not keys or (packed.is_file() and json.loads(packed.read_text()) == keys):
        return []
    manifest = {"verifier": verifier, "files": stamps(work / verifier), "keys": keys}
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for key in keys:
            tar.add(work / STORE / key, arcname=f"{STORE}/{key}")
            tar.add(work / STORE / f"{key}.json", arcname=f"{STORE}/{key}.json")
    files = [out]
    if tmp.stat().st_size > PART_BYTES:
        files = []
        with open(tmp, "rb") as f:
            for i, chunk in enumerate(iter(lambda: f.read(PART_BYTES), b"")):
                files.append(out.with_name(f"{out.name}.part{i}"))
                files[-1].write_bytes(chunk)
        tmp.unlink()
    else:
        tmp.rename(out)
    packed.write_text(json.dumps(keys))
    return files


def _member_ok(m: tarfile.TarInfo) -> bool:
    """A plain file or directory under the regenerate store, named without a way out of it."""
    parts = Path(m.name).parts
    return (m.isfile() or m.isdir()) and m.name.startswith(STORE + "/") and ".." not in parts and not m.name.startswith("/")


def restore(work: Path, verifier: Path, archive: Path) -> list[str]:
    """The archive's regenerate artifacts into `work`'s store (one already here is kept), where
    `verifier` holds the same files as the one they were made from (their mtimes then put back);
    returns the keys restored. A verifier that differs restores nothing (one line says so)."""
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile(MANIFEST))
        here = stamps(verifier)
        if {n: s["sha256"] for n, s in here.items()} != {n: s["sha256"] for n, s in manifest["files"].items()}:
            differ = sorted(n for n in {*here, *manifest["files"]} if (here.get(n) or {}).get("sha256") != (manifest["files"].get(n) or {}).get("sha256"))
            log(f"{archive}: made from another verifier ({', '.join(differ)} differ): not used, regenerate runs again")
            return []
        for name, s in manifest["files"].items():
            os.utime(verifier / name, ns=(s["mtime_ns"], s["mtime_ns"]))
        if bad := [m.name for m in tar.getmembers() if m.name != MANIFEST and not _member_ok(m)]:
            raise SystemExit(f"{archive}: not a carried archive ({bad[0]}): want files under {STORE}/ only")
        new = [k for k in manifest["keys"] if not (work / STORE / f"{k}.json").exists()]
        members = [m for m in tar.getmembers() if m.name != MANIFEST and Path(m.name).parts[3].removesuffix(".json") in new]
        # the record last: an artifact is complete once its record is there
        members.sort(key=lambda m: m.name.endswith(".json") and len(Path(m.name).parts) == 4)
        for d in (work / "outputs", work / "outputs/artifacts", work / STORE):
            d.mkdir(mode=0o700, exist_ok=True)  # private, as the store makes them (artifact_store.private_dirs)
        tar.extractall(work, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    packed = work / PACKED  # what the laptop has already: the next pack only when more is complete
    packed.write_text(json.dumps(sorted({*manifest["keys"], *(json.loads(packed.read_text()) if packed.is_file() else [])})))
    log(f"{archive}: regenerate artifacts {', '.join(new) or 'none new'} restored ({len(manifest['keys']) - len(new)} already here)")
    return new


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="the complete regenerate artifacts into OUT (only when new ones are complete)")
    pk.add_argument("workdir", type=Path)
    pk.add_argument("out", type=Path)
    pk.add_argument("--verifier", default="outputs/smollm2-verifier", help="the verifier directory, relative to WORKDIR")
    args = p.parse_args(argv)
    files = pack(args.workdir, args.out, args.verifier)
    print(", ".join(f"{f} ({f.stat().st_size / 2**20:.1f} MiB)" for f in files) if files else "no regenerate artifact completed since the last pack")


if __name__ == "__main__":
    main()
