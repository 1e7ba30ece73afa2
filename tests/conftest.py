"""Test bed. Fixtures that start real services live in tests/fixtures/ (one module each) and are
registered here, so any test can ask for `sshd`, `docker_engine`, ... by name."""

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.docker_engine",
    "tests.fixtures.pipeline_data",
    "tests.fixtures.netns",
]


def pytest_configure(config):
    """A suite started in the background of a shell without job control (`nohup ... &`) inherits
    SIGINT ignored, and so would every harness it starts: the Ctrl-C tests would fail for the
    launcher's sake. Python's own handler again; children then start with the default."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_terminal_summary(terminalreporter):
    """Say loudly which real test beds did not start (their tests were skipped, not passed)."""
    from tests.fixtures.beds import NOT_STARTED

    if NOT_STARTED:
        terminalreporter.section("TEST BEDS THAT DID NOT START: their tests were SKIPPED", sep="!", red=True, bold=True)
        for line in NOT_STARTED:
            terminalreporter.write_line(line, red=True, bold=True)
