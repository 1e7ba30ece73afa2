"""`harness pull`: fetch files from a host: selective, resumable, verified, atomic, parallel.

One pull, step by step (PullConnection: the first byte stream, started at once over the shared
ControlMaster, answers questions first: a run's record, which paths exist, which run `last` is)
  1. list   the first stream is asked for the listing of every source (a remote path and where
            it lands locally) in one question (pull_helper.py `send`): every entry under each as
            JSON (names never parsed from shell output; links reported, not followed). Then it
            carries the first bytes: one handshake and one remote start for the whole pull.
  2. select --include/--exclude (gitignore-style patterns on the path relative to REMOTE_PATH),
            --latest-checkpoint (only the newest speculators epoch directory `<ckpt root>/<N>/` of
            each checkpoint root, plus run records and logs).
  3. check  every name must land inside LOCAL_DIR: absolute names, `..`, a local parent that is a
            link leading out, a remote link whose target leads out: refused and reported, nothing
            written for them.
  4. fetch  each file is cut into pieces (PullOptions.piece_size), queued in file order; each
            stream (a long-lived helper in `send` mode, through transport.stream) takes the next piece as
            it finishes one. The first stream, after the listing, times pings: the link's round
            trip. On a long one (where each stream is capped by its channel window) the fetch
            starts at once as many streams as the bytes and the round trip call for
            (session.streams_for), as channels of the master (no handshake): `ssh -W`
            (direct-tcpip) channels to a listener the first stream's helper opened on the host's
            loopback (behind a random token sent over its stdout: no remote shell or Python to
            start; it ends with that helper), or, where the sshd forbids forwarding, helpers of
            their own on exec channels; then adding more (own connections) while they raise
            throughput, up to `jobs`; on a short link one stream (CPU-bound).
            Bytes land in `.NAME.harness-part` next to the target; `.NAME.harness-part.json`
            records the remote (size, mtime_ns) they copy and `.NAME.harness-part.done` how many
            bytes of each piece are in (after every write).
  5. verify one pass over the data on each side: the host computes each piece's CRC-32 as it
            sends it and ends the piece with it; the laptop computes it as the bytes arrive (after
            reading back what an earlier process received of it) and compares (why a CRC:
            partfile.py). The host checks
            the file's (size, mtime_ns) against the listing before and after each piece. A file
            is renamed to its final name only when every piece matched; a mismatched piece starts
            over, a file changed on the host is discarded; both are retried (fresh listing), then
            reported as failed. Files already present locally with the host's size are compared
            by whole-file SHA-256 first (one host command) and skipped when identical.

Resuming: a killed pull (Ctrl-C, kill -9, dropped link) leaves the part files; the next pull
continues each piece from the bytes recorded, as long as the host file's (size, mtime_ns) still
match; pieces an earlier process completed are checked against the host's CRC too.

Where files land: a remote directory's entries go to LOCAL_DIR/<its local>/<path relative to it>;
a remote file goes to LOCAL_DIR/<its local>/<its name> (`pull()`: one source, local ".").
"""

from harness.pull.options import PullOptions, PullProgress, PullReport
from harness.pull.partfile import PART_SUFFIX, received_bytes
from harness.pull.paths import clean_rel
from harness.pull.selection import RemoteEntry, select
from harness.pull.session import PullConnection, Source, pull

__all__ = ["PART_SUFFIX", "PullConnection", "PullOptions", "PullProgress", "PullReport", "RemoteEntry", "Source", "clean_rel", "pull", "received_bytes", "select"]
