"""`harness pull`: fetch files from a host: selective, resumable, verified, atomic, parallel.

One pull, step by step
  1. list   one remote command (harness/remote/pull_helper.py `list`) returns every entry under
            REMOTE_PATH as JSON (names never parsed from shell output; links reported, not
            followed).
  2. select --include/--exclude (gitignore-style patterns on the path relative to REMOTE_PATH),
            --latest-checkpoint (only the newest speculators epoch directory `<ckpt root>/<N>/` of
            each checkpoint root, plus run records and logs).
  3. check  every name must land inside LOCAL_DIR: absolute names, `..`, a local parent that is a
            link leading out, a remote link whose target leads out: refused and reported, nothing
            written for them.
  4. hash   one remote command hashes every selected file (SHA-256 on the host), concurrently
            with the download.
  5. fetch  each file is cut into pieces (PullOptions.piece_size), queued in file order; each
            stream (a long-lived helper in `send` mode, through OpenSSH) takes the next piece as
            it finishes one. The first stream starts while the listing runs, over its own
            connection for a big pull (the ControlMaster relay costs a copy) or the shared one.
            Its first request times the link: on a long round trip (where one stream is capped
            by its channel window) streams are added, each on its own connection, while they
            raise throughput, up to `jobs`; on a short one a single stream is fastest (CPU-bound).
            Bytes land in `.NAME.harness-part` next to the
            target; `.NAME.harness-part.json` records the remote (size, mtime_ns) they copy and
            `.NAME.harness-part.done` how many bytes of each piece are in (after every write).
  6. verify a local hasher follows the contiguous received prefix, so the local SHA-256 is ready
            moments after the last byte; it must equal the host's hash (taken from a file that
            did not change while hashed). Only then is the part renamed to its final name.
            A mismatch or a file changed on the host is retried (fresh listing, fresh hash), then
            reported as failed; its bytes are never kept.

Resuming: a killed pull (Ctrl-C, kill -9, dropped link) leaves the part files; the next pull
continues each piece from the bytes recorded, as long as the host file's (size, mtime_ns) still
match. Files whose local copy already has the host's SHA-256 are skipped.

Where files land: a remote directory's entries go to LOCAL_DIR/<path relative to REMOTE_PATH>; a
remote file goes to LOCAL_DIR/<its name>.
"""

from harness.pull.options import PullOptions, PullProgress, PullReport
from harness.pull.partfile import PART_SUFFIX, received_bytes
from harness.pull.paths import clean_rel
from harness.pull.selection import RemoteEntry, select
from harness.pull.session import pull

__all__ = ["PART_SUFFIX", "PullOptions", "PullProgress", "PullReport", "RemoteEntry", "clean_rel", "pull", "received_bytes", "select"]
