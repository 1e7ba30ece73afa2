"""`harness sync`: push the project's code (SyncConfig.paths) to <workdir> on a host, incrementally.

Only what changed moves. The host keeps a manifest of what sync put there
(<workdir>/.harness/sync-manifest.json). A sync starts ONE helper process on the host
(host_helpers/sync_apply.py, by harness.helpers.start), which sends that manifest back while the
local tree is scanned; the entries that differ then go over the same process as one stream. A
no-op sync costs one remote exec and writes nothing on the host. Regular files and symlinks (as
links) go; `.git`, ignored files and links out of the tree do not. Deletions touch only paths the
manifest lists, under the current sync paths: outputs sync did not write are never touched.

A run records the manifest's digest: the digest of the code it used (the supervisor reads it on
the host, at the MANIFEST_PATH harness.jobs hands it). How it decides, sends and deletes:
docs/architecture/sync.md, "harness sync, step by step"; the modules here hold one concept each
(paths, ignore, hashing, scan, manifest, plan, framing, session, result).
"""

from harness.sync.framing import RECORD
from harness.sync.hashing import sha256_file
from harness.sync.manifest import MANIFEST_PATH
from harness.sync.paths import shown_path
from harness.sync.plan import SyncPlan
from harness.sync.result import ProgressCallback, SyncError, SyncOutcome, SyncResult
from harness.sync.scan import scan_local
from harness.sync.session import SYNC_APPLY, PreparedSync, sync, sync_hosts

__all__ = ["MANIFEST_PATH", "RECORD", "SYNC_APPLY", "PreparedSync", "ProgressCallback", "SyncError", "SyncOutcome", "SyncPlan", "SyncResult",
           "scan_local", "sha256_file", "shown_path", "sync", "sync_hosts"]
