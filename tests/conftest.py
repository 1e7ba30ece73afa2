"""Test bed. Fixtures that start real services live in tests/fixtures/ (one module each) and are
registered here, so any test can ask for `sshd`, `docker_engine`, ... by name."""

import os

# One OpenMP thread for every process the tests start (stages, harness, and by SetEnv the tests'
# sshd sessions): three lanes share 2 cores, and a torch process of 2 threads then spin-waits
# against the others' (bench/omp_wait.py; vLLM's tests had set it already). Before any torch import.
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.docker_engine",
    "tests.fixtures.pipeline_data",
    "tests.fixtures.netns",
    "tests.fixtures.other_user",
]


def pytest_configure(config):
    """A suite started in the background of a shell without job control (`nohup ... &`) inherits
    SIGINT ignored, and so would every harness it starts: the Ctrl-C tests would fail for the
    launcher's sake. Python's own handler again; children then start with the default."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The longest tests, longest first (CI's --durations on the 2-core machine): they start first, in
# parallel lanes, and the short ones fill in around them, so the run is not left waiting on one
# long test at its end. scripts/test.sh hands xdist whole files (--dist loadfile), in this order
# (--no-loadscope-reorder: xdist would otherwise put the files with the most tests first).
LONGEST_FIRST = (
    "tests/test_demo.py",  # the README's first command in a pristine container: set-up + demo
    "tests/test_container_ml.py",  # the production image's build from PyPI, the demo chain inside it
    "tests/test_serve_vllm.py",  # a draft trained, then five vLLM engine starts (one in a container)
    "tests/test_smollm2.py",  # SmolLM2-135M through the pipeline on 2 cores: 6-12 min
    "tests/test_kimi_k25.py",
    "tests/test_vllm.py",  # three vLLM engine starts
    "tests/test_vllm_online.py",  # two vLLM engine starts, two cut short, an offline pipeline
    "tests/test_multinode.py",  # many short cluster runs: the longest file of short tests
)


def pytest_collection_modifyitems(config, items):
    """Order: LONGEST_FIRST's files, then other `slow` tests, then the rest (stable otherwise)."""

    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        if path in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(path)
        return (1, 0) if item.get_closest_marker("slow") else (2, 0)

    items.sort(key=rank)


NOT_STARTED: list[str] = []  # "test bed ... cannot start: reason", once each (pytest_runtest_logreport)


def pytest_runtest_logreport(report):
    """Gather the beds that did not start from the test reports (the controller's, under xdist)."""
    from tests.fixtures.beds import not_started

    line = not_started(report)
    if line and line not in NOT_STARTED:
        NOT_STARTED.append(line)


def pytest_terminal_summary(terminalreporter):
    """Say loudly which real test beds did not start (their tests were skipped, not passed), and
    leave the lines where scripts/test.sh repeats them after pytest's output."""
    from tests.fixtures.beds import REPORT_FILE_ENV

    if NOT_STARTED and not hasattr(terminalreporter.config, "workerinput"):
        terminalreporter.section("TEST BEDS THAT DID NOT START: their tests were SKIPPED", sep="!", red=True, bold=True)
        for line in NOT_STARTED:
            terminalreporter.write_line(line, red=True, bold=True)
        if os.environ.get(REPORT_FILE_ENV):
            with open(os.environ[REPORT_FILE_ENV], "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in NOT_STARTED))
