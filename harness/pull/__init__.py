"""`harness pull`: fetch files from a host: selective, resumable, verified, atomic, parallel.

One pull lists every source in one question on the first byte stream (which starts at once and
answers the caller's questions first), selects (--include/--exclude, --latest-checkpoint),
refuses any name that would land outside LOCAL_DIR, then fetches each file in pieces over as
many streams as the link's round trip calls for, each piece checked by CRC-32 on both sides and
each file renamed into place only once every piece matched. A killed pull resumes from the part
files it left. docs/architecture/pull.md ("harness pull, step by step") says how and why; the modules
here hold one concept each (session, selection, paths, local_disk, host, partfile, streams,
options).
"""

from harness.pull.options import PullOptions, PullProgress, PullReport
from harness.pull.partfile import PART_SUFFIX, received_bytes
from harness.pull.paths import clean_rel
from harness.pull.selection import RemoteEntry, select
from harness.pull.session import PullConnection, Source, pull

__all__ = ["PART_SUFFIX", "PullConnection", "PullOptions", "PullProgress", "PullReport", "RemoteEntry", "Source", "clean_rel", "pull", "received_bytes", "select"]
