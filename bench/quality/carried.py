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
        (on the device, every call: the archive is made again only when another artifact is
        complete, and written to OUT each call, as a call's files may not come back; over 15 MiB
        as OUT.part0, .part1, ..., since a call brings back at most 16 MiB a file: `cat` them)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.host_helpers.artifact_store import KEY_RE, Store, tree_files  # noqa: E402
from harness.sync.hashing import sha256_file  # noqa: E402

STAGE = "regenerate"
STORE = "outputs/artifacts"  # the study's artifact store (its harness runs' output_dir "outputs")
MANIFEST = "carried.json"
MADE = ".carried"  # in the workdir: the archive of the keys packed last, kept for the next call
PART_BYTES = 15 << 20


def log(msg: str) -> None:
    print(f"[carried] {msg}", file=sys.stderr, flush=True)


def stamps(verifier: Path) -> dict[str, dict]:
    """Each file of the verifier directory, as the store's key counts them (tree_files): its content and mtime."""
    return {name: {"sha256": sha256_file(path), "mtime_ns": os.stat(path).st_mtime_ns} for name, path in tree_files(str(verifier))}


def complete_keys(store: Store) -> list[str]:
    """The regenerate artifacts that are complete (their record written) and not being made."""
    return [key for stage, key in store.artifacts() if stage == STAGE and store.record(stage, key) and not store.busy(stage, key)]


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """What goes in the archive: plain files and directories (a link would be refused on restore)."""
    return info if info.isfile() or info.isdir() else None


def pack(work: Path, out: Path, verifier: str) -> list[Path]:
    """The complete regenerate artifacts and the verifier's stamps in `out` (or its parts),
    returned; none when there is no complete artifact. The archive is made again only when the
    set of complete artifacts changed; it is written to `out` at every call."""
    store = Store(str(work), STORE)
    keys = complete_keys(store)
    if not keys:
        return []
    made = work / MADE / f"{hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]}.tgz"
    if not made.is_file():
        shutil.rmtree(work / MADE, ignore_errors=True)
        made.parent.mkdir(mode=0o700)
        manifest = json.dumps({"verifier": verifier, "files": stamps(work / verifier), "keys": keys}, indent=1).encode()
        tmp = made.with_suffix(".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
            for key in keys:
                tar.add(store.dir(STAGE, key), arcname=f"{STAGE}/{key}", filter=_plain)
                tar.add(store.dir(STAGE, key) + ".json", arcname=f"{STAGE}/{key}.json")
        tmp.rename(made)
    if made.stat().st_size <= PART_BYTES:
        shutil.copyfile(made, out)
        return [out]
    files = []
    with open(made, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(PART_BYTES), b"")):
            files.append(out.with_name(f"{out.name}.part{i}"))
            files[-1].write_bytes(chunk)
    return files


def _members(tar: tarfile.TarFile, keys: list[str]) -> dict[str, list[tarfile.TarInfo]] | str:
    """The archive's members by key (each key's directory, its files and its record), or what is
    wrong with it: a key that is not a key, a member that is not a plain file or directory in a
    listed key's place (regenerate/KEY.json, regenerate/KEY/...)."""
    if bad := [k for k in keys if not (isinstance(k, str) and KEY_RE.match(k))]:
        return f"key {bad[0]!r}"
    by_key: dict[str, list[tarfile.TarInfo]] = {k: [] for k in keys}
    for m in tar.getmembers():
        if m.name == MANIFEST:
            continue
        parts = Path(m.name).parts
        is_record = len(parts) == 2 and parts[1].endswith(".json")
        key = parts[1].removesuffix(".json") if is_record else parts[1] if len(parts) >= 2 else None
        if parts[:1] != (STAGE,) or key not in by_key or ".." in parts or m.name.startswith("/") or not (m.isfile() if is_record else m.isfile() or m.isdir()):
            return m.name
        by_key[key].append(m)
    return by_key


def restore(work: Path, verifier: Path, archive: Path) -> list[str]:
    """The archive's regenerate artifacts into `work`'s store, each whole (its files, then its
    record) or not at all, where `verifier` holds the same files as the one they were made from
    (their mtimes then put back); returns the keys restored. One already here, or being made, is
    kept. An archive that is not ours or a verifier that differs restores nothing: one line says
    why, and regenerate runs again."""
    store = Store(str(work), STORE)
    restored = []
    with tarfile.open(archive) as tar:
        try:
            manifest = json.load(tar.extractfile(MANIFEST))
            by_key = _members(tar, list(manifest["keys"])) if isinstance(manifest["files"], dict) else "its manifest"
        except (KeyError, TypeError, ValueError):
            by_key = "its manifest"
        if isinstance(by_key, str):
            log(f"{archive}: not a carried archive ({by_key}: want plain files under {STAGE}/<key>/): not used, regenerate runs again")
            return []
        here = stamps(verifier)
        if {n: s["sha256"] for n, s in here.items()} != {n: s["sha256"] for n, s in manifest["files"].items()}:
            differ = sorted(n for n in {*here, *manifest["files"]} if (here.get(n) or {}).get("sha256") != (manifest["files"].get(n) or {}).get("sha256"))
            log(f"{archive}: made from another verifier ({', '.join(differ)} differ): not used, regenerate runs again")
            return []
        for name, s in manifest["files"].items():
            os.utime(verifier / name, ns=(s["mtime_ns"], s["mtime_ns"]))
        for key, members in by_key.items():
            record = next((m for m in members if m.name == f"{STAGE}/{key}.json"), None)
            recorded = json.load(tar.extractfile(record)) if record else {}
            if recorded.get("key") != key or recorded.get("stage") != STAGE or store.record(STAGE, key) or os.path.exists(store.dir(STAGE, key)):
                continue  # not whole in the archive; complete here already; or this store's own, unfinished
            fd = store.lock(STAGE, key, "carried.py restore")
            if fd is None:
                continue  # a run is making it
            try:
                tmp = Path(store.dir(STAGE, f".carried-{key}"))
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(mode=0o700)
                for m in members:
                    rel = Path(*Path(m.name).parts[2:])
                    if m is record or not rel.parts:
                        continue
                    if m.isdir():
                        (tmp / rel).mkdir(mode=0o700, parents=True, exist_ok=True)
                    else:
                        (tmp / rel).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                        fd_out = os.open(tmp / rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                        with os.fdopen(fd_out, "wb") as f:
                            shutil.copyfileobj(tar.extractfile(m), f)
                tmp.rename(store.dir(STAGE, key))
                store.complete(STAGE, key, recorded)  # last: the artifact is complete
                restored.append(key)
            finally:
                os.close(fd)
    log(f"{archive}: regenerate artifacts {', '.join(restored) or 'none'} restored, of {len(manifest['keys'])} carried")
    return restored


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="the complete regenerate artifacts into OUT")
    pk.add_argument("workdir", type=Path)
    pk.add_argument("out", type=Path)
    pk.add_argument("--verifier", default="outputs/smollm2-verifier", help="the verifier directory, relative to WORKDIR")
    args = p.parse_args(argv)
    files = pack(args.workdir, args.out, args.verifier)
    print(", ".join(f"{f} ({f.stat().st_size / 2**20:.1f} MiB)" for f in files) if files else "no complete regenerate artifact yet")


if __name__ == "__main__":
    main()
