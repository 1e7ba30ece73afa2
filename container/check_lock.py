"""Build-time check (container/Dockerfile, before any pip install): the base image's Python is
one that container/constraints.txt was locked for. The lock names them on its `# python:` line
(scripts/lock-container-requirements.sh writes it); any other interpreter fails the build here
with one line, instead of pip resolving pins that were never checked for it.

usage: python3 check_lock.py CONSTRAINTS
"""

import sys

MARKER = "# python:"


def covered(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(MARKER):
                return line[len(MARKER):].split()
    return []


def main(argv):
    path = argv[1]
    versions = covered(path)
    here = "%d.%d" % sys.version_info[:2]
    if not versions:
        print("check_lock: %s has no '%s' line: regenerate it with scripts/lock-container-requirements.sh" % (path, MARKER), file=sys.stderr)
        return 1
    if here not in versions:
        print(
            "check_lock: the base image's Python is %s; the lock (container/constraints.txt) covers Python %s only: "
            "use a base image with one of those, or add %s to PYTHONS in scripts/lock-container-requirements.sh and re-lock"
            % (here, ", ".join(versions), here),
            file=sys.stderr,
        )
        return 1
    print("check_lock: Python %s is covered by the lock (%s)" % (here, ", ".join(versions)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
