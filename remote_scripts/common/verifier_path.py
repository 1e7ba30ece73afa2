"""A verifier that is plainly a path on this host, checked before any library tries it.

`--verifier` is a directory or a Hugging Face id ("org/name"). Given a path that is not there,
transformers asks the hub and answers with the hub's words ("Repo id must be in the form
'repo_name' or 'namespace/repo_name'"), which name neither the path nor the fix. Every stage that
takes --verifier calls `check` first (common/events.run_stage), so a missing directory is one
line naming it. An "org/name" that is not a directory here is left to the hub. And what a verifier
import_verifier.py made was imported from (PROVENANCE), for whoever would reuse it. Standard library only.
"""

from __future__ import annotations

import os


class VerifierNotFound(Exception):
    """The verifier is a path and nothing is there; the message says what to do."""


def looks_like_hub_id(path: str) -> bool:
    """"org/name": one `/` between two non-empty parts, not starting with `/`, `~` or `.` (a hub
    name never does). The laptop's and host helpers' rule too (harness/host_helpers/wire.py
    is_hub_id, which stage code cannot import: tests/test_wire.py holds the two equal)."""
    return path.count("/") == 1 and not path.startswith(("/", "~", ".")) and all(path.split("/"))


def resolve(path: str) -> str:
    """An existing local verifier as an absolute path (a draft's config records it, and vLLM reads
    it from any directory); a Hugging Face id as given."""
    if os.path.exists(os.path.expanduser(path)):
        full = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(os.path.join(full, "config.json")):
            raise VerifierNotFound(f"{path}: no config.json in that directory: point the verifier at a Hugging Face model directory")
        return full
    check(path)
    return path


def check(path: str | None) -> None:
    if not path or os.path.exists(os.path.expanduser(path)) or looks_like_hub_id(path):
        return
    raise VerifierNotFound(f"{path}: no such directory on this host (working directory {os.getcwd()}): "
                           "put the verifier there, or set [pipeline] verifier to its path here or to a Hugging Face id (org/name)")


PROVENANCE = "imported_from.json"  # in a verifier import_verifier.py made: what from (a later run reuses it only for the same source)


def provenance(source: str, dtype: str) -> dict:
    """What a verifier was imported from, as a run that would reuse it checks it: the source's name,
    its size (a file's bytes; a directory's config.json and weights' bytes) and the dtype."""
    if os.path.isfile(source):
        files = [source]
    else:
        files = sorted(os.path.join(source, f) for f in os.listdir(source) if f == "config.json" or f.endswith((".safetensors", ".bin")))
    return {"source": os.path.basename(os.path.normpath(source)), "source_bytes": sum(os.path.getsize(f) for f in files), "dtype": dtype}
