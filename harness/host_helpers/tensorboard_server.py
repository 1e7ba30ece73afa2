"""TensorBoard served on a unix socket (run by harness.tensorboard in the stage environment, which
has tensorboard; a harness.host_server.HostServer: its lifeline ends it). Standard library at the
top level: tensorboard is imported when it runs, so a missing one is its last line on stderr.

stdin: {"directory": DIR, "logdir": LOGDIR, "ready": LINE} (harness/helpers.py). It makes DIR
(0700; an existing one is refused, so no one can set it up beforehand), serves LOGDIR on
DIR/tensorboard.sock, prints LINE once the socket listens, and removes DIR when it ends (a
SIGTERM: the lifeline's end). Never a TCP port: --load_fast=false (the fast loader is a second
server, on a loopback TCP port), and no info file in /tmp for `tensorboard --list`.
"""

import json
import os
import shutil
import signal
import sys


def serve(program, serving, directory, logdir, ready):
    path = os.path.join(directory, "tensorboard.sock")

    class Server(serving.ThreadedWSGIServer, program.TensorBoardServer):
        def __init__(self, app, flags):
            serving.ThreadedWSGIServer.__init__(self, "unix://" + path, 0, app)

        def get_url(self):
            return "unix:" + path

        def print_serving_message(self):
            print(ready, flush=True)

    class Board(program.TensorBoard):
        def _register_info(self, server):
            pass  # nothing to connect to for `tensorboard --list`

    board = Board(server_class=Server)
    board.configure(argv=[None, "--logdir", logdir, "--load_fast", "false"])
    return board.main()


def main():
    request = json.load(sys.stdin)
    directory = request["directory"]
    from tensorboard import program  # first: where it is missing, nothing is made
    from werkzeug import serving

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.mkdir(directory, 0o700)
    try:
        sys.exit(serve(program, serving, directory, request["logdir"], request["ready"]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
