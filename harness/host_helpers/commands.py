"""Several host commands in one round trip (run by harness.helpers.Prefetched; stdlib only).

stdin: {"commands": [ARGV, ...], "home_token": TOKEN, "stop_on_failure": BOOL} (harness/helpers.py)
stdout: {"home": HOME, "results": [{"exit_code": N, "stdout": TEXT, "stderr": TEXT}, ...]}

Each ARGV runs as transport.run would start it (no shell of ours, the helper's cwd: the login
directory), one after another; TOKEN anywhere in an argument is the home directory (the laptop
never asks for it). With stop_on_failure the commands after the first that exits non-zero are
not run (their results are absent). Output bytes that are not UTF-8 travel as surrogate escapes.
"""

import json
import os
import subprocess
import sys


def main(request):
    home = os.path.expanduser("~")
    token = request.get("home_token") or None
    results = []
    for argv in request["commands"]:
        argv = [a.replace(token, home) if token else a for a in argv]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
            result = {"exit_code": done.returncode, "stdout": done.stdout.decode("utf-8", "surrogateescape"),
                      "stderr": done.stderr.decode("utf-8", "surrogateescape")}
        except OSError as e:  # no such program: what a shell would say, with its code
            result = {"exit_code": 127, "stdout": "", "stderr": "%s: %s\n" % (argv[0], e.strerror)}
        results.append(result)
        if request.get("stop_on_failure") and result["exit_code"] != 0:
            break
    json.dump({"home": home, "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.load(sys.stdin)))
