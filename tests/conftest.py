"""Test bed. Fixtures that start real services live in tests/fixtures/ (one module each) and are
registered here, so any test can ask for `sshd`, `docker_engine`, ... by name."""

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.docker_engine",
    "tests.fixtures.pipeline_data",
    "tests.fixtures.netns",
]


def pytest_terminal_summary(terminalreporter):
    """Say loudly which real test beds did not start (their tests were skipped, not passed)."""
    from tests.fixtures.beds import NOT_STARTED

    if NOT_STARTED:
        terminalreporter.section("TEST BEDS THAT DID NOT START: their tests were SKIPPED", sep="!", red=True, bold=True)
        for line in NOT_STARTED:
            terminalreporter.write_line(line, red=True, bold=True)
