"""failure_cause: torchrun's stderr tail -> one line. The tails are torchrun 2.13's own output,
as it appeared in a node's log (abridged only where frames repeat). A real failing rank through
torchrun is tested in test_multinode.py::test_a_failed_rank_is_named_in_the_group_status."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from common.torchrun_output import MAX_CHARS, failure_cause, is_peer_loss  # noqa: E402

AGENT_FRAMES = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/usr/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
"""

# A rank passed its checks, then aborted in the interpreter's teardown (seen in CI, 2026-11-30).
RANK_ABORTED = ("""[dist_check] rank 0/3 on vm: all checks passed
terminate called without an active exception
E1130 15:30:29.505000 15234 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 16169) of binary: /usr/bin/python
""" + AGENT_FRAMES + """torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
======================================================
remote_scripts/dist_check.py FAILED
------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_15:30:29
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 16169)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 16169
======================================================
""")

# The node that hosted the rendezvous went away: torchrun itself fails, chained exceptions.
STORE_GONE = """Traceback (most recent call last):
  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 114, in _call_store
    return getattr(self._store, store_op)(*args, **kwargs)
torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 116, in _call_store
    raise RendezvousConnectionError(
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.
"""

# A rank raised: its traceback, then torchrun's report (exit code 1, no signal).
RANK_RAISED = ("""Traceback (most recent call last):
  File "remote_scripts/train_draft.py", line 461, in <module>
    sys.exit(main())
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
""" + AGENT_FRAMES + """torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
======================================================
Root Cause (first observed failure):
[0]:
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
======================================================
""")


def lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_a_signal_names_the_rank_the_signal_and_its_last_words():
    assert failure_cause(lines(RANK_ABORTED)) == "rank 0 (local_rank: 0): SIGABRT; terminate called without an active exception"


def test_an_exception_in_a_rank_names_the_rank_and_the_exception():
    assert failure_cause(lines(RANK_RAISED)) == "rank 3 (local_rank: 1): exit code 1; OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def test_torchruns_own_failure_is_its_last_exception():
    assert failure_cause(lines(STORE_GONE)) == "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details."


def test_no_traceback_gives_the_last_line_and_nothing_gives_none():
    assert failure_cause(["W1130 12:00:00.000 1 x.py:1] noise\n", "error: unrecognized arguments: --bogus\n", "\n"]) == "error: unrecognized arguments: --bogus"
    assert failure_cause([]) is None and failure_cause(["\n", "  \n"]) is None


def test_the_line_is_bounded():
    cause = failure_cause(["ValueError: " + "x" * 1000 + "\n"])
    assert cause is not None and len(cause) == MAX_CHARS and cause.endswith("...")


def test_a_rank_that_lost_its_peer_is_told_from_one_that_failed_by_itself():
    # Cause lines as two nodes printed them (CI's failed run and a local repeat, 2026-11-30): rank 1
    # failed by itself, rank 0 lost it.
    lost = ("rank 0 (local_rank: 0): exit code 1; [dist_check] finished: failed (RuntimeError: [/__w/pytorch/pytorch/third_party/"
            "gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:11915. This is typically caused by a remote wo...")
    own = "rank 1 (local_rank: 0): exit code 1; [dist_check] finished: failed (rank 1 fails at step 2 as asked (--fail-rank))"
    assert is_peer_loss(lost) and not is_peer_loss(own)
    assert is_peer_loss(failure_cause(lines(STORE_GONE)))  # node 0's store went away
    assert is_peer_loss("rank 2 (local_rank: 0): exit code 1; DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2046, remote process exited or there was a network error")
    assert not is_peer_loss(failure_cause(lines(RANK_RAISED))) and not is_peer_loss(failure_cause(lines(RANK_ABORTED)))
    assert is_peer_loss(None)  # nothing to go on: wait for a peer's word rather than claim the failure
