"""Build-time record (container/Dockerfile, after the installs): which torch, transformers,
speculators and vllm the image holds, read from package metadata (speculators 0.9.0 has no
`__version__`), printed as one line and kept in a JSON file that every run records
(harness.jobs reads it through harness.runtime.preflight).

usage: python3 record_versions.py OUTPUT [--require NAME ...]
  --require  these must be installed AND import (the ML install); a missing or broken one fails
             the build with one line
"""

import importlib
import importlib.metadata as metadata
import json
import os
import sys

PACKAGES = ("torch", "transformers", "speculators", "vllm")


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv):
    output, required = argv[1], argv[3:] if argv[2:3] == ["--require"] else []
    versions = {name: installed(name) for name in PACKAGES}
    print("image versions: " + ", ".join("%s %s" % (n, v or "absent") for n, v in versions.items()))
    for name in required:
        if not versions.get(name, installed(name)):
            print("record_versions: %s is not installed after the ML install" % name, file=sys.stderr)
            return 1
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure is the finding
            print("record_versions: %s %s is installed but does not import: %s: %s" % (name, versions.get(name), type(e).__name__, e), file=sys.stderr)
            return 1
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output + ".tmp", "w", encoding="utf-8") as f:
        json.dump(versions, f, sort_keys=True)
        f.write("\n")
    os.replace(output + ".tmp", output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
