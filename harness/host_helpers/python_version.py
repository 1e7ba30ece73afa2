"""The version of the interpreter the host helpers run on (`harness doctor`'s python3 check).

stdin: {} (harness/helpers.py)  stdout: {"version": "3.11.4", "executable": PATH}. Kept to what
any Python 3 runs: telling an old one apart is its point.
"""

import json
import sys

if __name__ == "__main__":
    sys.stdin.read()  # the request: nothing to ask
    json.dump({"version": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable}, sys.stdout)
