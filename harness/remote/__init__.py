"""Files the harness ships to a host and runs there with the host's python3 (standard library
only; never imported by the laptop side except to read their source)."""
