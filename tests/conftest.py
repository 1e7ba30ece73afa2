"""Test bed. Fixtures that start real services live in tests/fixtures/ (one module each) and are
registered here, so any test can ask for `sshd`, `docker_engine`, ... by name."""

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.docker_engine",
    "tests.fixtures.pipeline_data",
    "tests.fixtures.netns",
]
