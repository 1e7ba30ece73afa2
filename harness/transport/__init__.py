"""Reach a host: `connect(host_config)` -> a Transport (LocalTransport or SSHTransport).

This package does not import harness.config: what it takes of a configured host is a
ConnectionSpec, made from the host's configuration by `connect`.

Its names load on first use (PEP 562): importing a module of this package (the warm exec,
transport/warm_exec.py) must not pay for base.py and dataclasses.
"""

_WHERE = {
    "ConnectOptions": "connection", "ConnectionSpec": "connection", "connect": "connection",
    "OutputSink": "base", "RemoteStat": "base", "RunResult": "base", "Transport": "base", "quote_argv": "base",
}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.transport' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"harness.transport.{module}"), name)
    globals()[name] = value  # once: later lookups find it here
    return value


__all__ = sorted(_WHERE)
