"""Serve an exported draft with vLLM until stopped, reporting its served acceptance as it goes.

    python remote_scripts/serve_draft.py --export EXPORT_DIR [--private-socket | --socket-dir DIR | --port PORT] [--interval 5] [vllm serve flags]

`vllm serve VERIFIER --speculative-config '{"method": "eagle3", "model": EXPORT_DIR, ...}'` (the
verifier and K from the export; common/draft_serving.py), in its own process group, log kept at
--log. Stage events go to STDOUT as JSON lines (docs/events.json; stage "serve"): a message when
the server is healthy (its text begins "ready after": `harness serve` waits for it), then a metric event whenever vLLM's spec-decode counters in /metrics moved
(`served_tau`, `served_acceptance_<i>`, `drafts`: since the server started). `harness serve`
runs it in the stage runtime with --private-socket (vLLM on a unix socket in a new 0700 directory
of a random name made here, reported as an `artifact` event of kind `socket`: no other uid of the
box reaches it, or can take its name first), relays connections to it and prints those. SIGTERM (or SIGINT) stops the
server (SIGTERM to its group, grace, SIGKILL) and ends the script; so does the server's death.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.draft_serving import ServeCheckError, cannot_serve, read_export  # noqa: E402
from common.events import EventLog  # noqa: E402
from common.spec_metrics import SpecCounters, read_counters  # noqa: E402
from common.vllm_server import ManagedServer, ServeOptions, ServerFailed, StageCancelled, add_serve_arguments, log_tail, private_socket, server_port, sigterm_raises  # noqa: E402

STAGE = "serve"


class StdoutEvents(EventLog):
    """The events as JSON lines on stdout (the caller's pipe), not in a file."""

    def __init__(self):
        super().__init__(STAGE, path=None, echo=False)

    def emit(self, event: str, **fields) -> None:
        record = {"t": round(time.time(), 3), "stage": self.stage, "event": event, **fields}
        print(json.dumps(record, default=str), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", required=True, help="the export stage's directory")
    p.add_argument("--speculative-tokens", type=int, default=None, help="K (default: the export's)")
    p.add_argument("--log", default=None, help="vLLM's log (default: outputs/serve/vllm-PORT.log under the working directory; on a socket, vllm-DIRNAME.log)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between reads of /metrics")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--private-socket", action="store_true",
                   help="listen on a unix socket, not on a TCP port, in a new 0700 directory of a random name (reported as an artifact event), removed at the end")
    p.add_argument("--socket-dir", default=None,
                   help="listen on DIR/vllm.sock, not on a TCP port: DIR is made here (0700; an existing one is refused) and removed at the end")
    p.add_argument("--api-key-file", default=None, help="a 0600 file holding vLLM's API key, read and removed at start (harness serve hands its key over so); default: a key made here")
    add_serve_arguments(p.add_argument_group("vllm serve"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    events = StdoutEvents()
    events.started(**vars(args))
    try:
        serve(args, events)
    except (StageCancelled, KeyboardInterrupt) as e:  # SIGTERM, or Ctrl-C on a terminal: the server was stopped on the way out
        events.finished("ok", stopped="SIGTERM" if isinstance(e, StageCancelled) else "SIGINT")
        return 0
    except (ServeCheckError, ServerFailed) as e:
        events.finished("failed", error=str(e))
        return 1
    except Exception as e:  # noqa: BLE001 -- one line for the laptop, the traceback on stderr
        return events.failed(e)
    return 0


def take_key(path: str | None) -> str | None:
    """The key in `path`, which is removed: it lives on only in this process and vLLM's."""
    if path is None:
        return None
    try:
        return Path(path).read_text().strip() or None
    finally:
        Path(path).unlink(missing_ok=True)


def serve(args: argparse.Namespace, events: EventLog) -> None:
    from common.vllm_compat import default_vllm_command, installed_distribution

    export = read_export(args.export)
    installed = installed_distribution()
    if args.vllm_command == default_vllm_command() and installed is None:
        raise ServeCheckError("vLLM is not installed where the stages run (docker hosts: the ML image has it; harness build)")
    why = cannot_serve(export, installed[0] if installed else None)
    if why:
        raise ServeCheckError(f"vLLM cannot serve this verifier here: {why}")
    extra = [*export.serve_args(args.speculative_tokens), *(["--trust-remote-code"] if args.trust_remote_code else []), *args.vllm_arg]
    # SIGTERM unwinds from before the socket's directory is made: it goes too
    on_socket = args.private_socket or args.socket_dir
    with sigterm_raises(), (private_socket(args.socket_dir, prefix="harness-serve-") if on_socket else contextlib.nullcontext()) as uds:
        if uds:
            events.artifact(uds, kind="socket")  # where harness relays to: a name only this process knew
        port = 0 if uds else server_port(args)
        opts = ServeOptions(model=export.verifier, host=args.host, port=port, tensor_parallel_size=args.tensor_parallel_size,
                            max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                            vllm_command=args.vllm_command, extra_args=extra, uds=uds)
        name = Path(uds).parent.name if uds else str(port)
        log = Path(args.log) if args.log else Path("outputs") / "serve" / f"vllm-{name}.log"
        serve_until_stopped(args, events, export, opts, log)


def serve_until_stopped(args: argparse.Namespace, events: EventLog, export, opts: ServeOptions, log: Path) -> None:
    with ManagedServer(opts, log, stop_grace=args.stop_grace, api_key=take_key(args.api_key_file)) as server:
        events.message(f"starting vllm serve {export.verifier} with the eagle3 draft {export.directory} (k={args.speculative_tokens or export.speculative_tokens}); log {log}")
        seconds = server.wait_healthy(args.health_timeout)
        events.message(f"ready after {seconds:.0f} s: model {export.verifier!r} at {opts.where} (/v1/completions, /v1/chat/completions, /metrics; its workers in {server.network})")
        last = SpecCounters()
        while True:
            time.sleep(args.interval)
            if not server.alive():
                raise ServerFailed(f"vllm serve exited (status {server.proc.poll()}); log {log}: {log_tail(log)}")
            try:
                now = read_counters(opts)
            except OSError:
                continue  # a busy server: the next read
            if now.drafts != last.drafts:
                events.metric(now.drafts, served_tau=round(now.tau, 4), drafts=now.drafts, accepted_tokens=now.accepted,
                              **{f"served_acceptance_{i + 1}": a for i, a in enumerate(now.acceptance_per_position)})
                last = now


if __name__ == "__main__":
    sys.exit(main())
