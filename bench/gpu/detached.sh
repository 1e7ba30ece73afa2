#!/usr/bin/env bash
# A bench longer than one device call (10 minutes), run across back-to-back calls on a warm machine:
#   bash bench/gpu/detached.sh start NAME CMD...   # CMD in its own session (it outlives the call), output to /tmp/detached/NAME.log
#   bash bench/gpu/detached.sh wait NAME SECONDS   # the log's new lines until CMD ends (exit: CMD's) or SECONDS pass (exit 3: still running)
# Each call returns well inside its limit; start the next at once (the machine goes back after 30 s idle).
set -euo pipefail
dir=/tmp/detached; mkdir -p "$dir"
verb=${1:?usage: detached.sh start NAME CMD... | wait NAME SECONDS}; name=${2:?name}; shift 2
log=$dir/$name.log rc=$dir/$name.rc
case $verb in
start)
  [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null && { echo "$name is already running"; exit 1; }
  rm -f "$rc" "$dir/$name.shown"
  setsid nohup bash -c '"$@"; echo $? > "$0"' "$rc" "$@" > "$log" 2>&1 < /dev/null &
  echo $! > "$dir/$name.pid"
  echo "started $name (pid $!): $*"
  ;;
wait)
  end=$(( $(date +%s) + ${1:?seconds} )); shown=$(cat "$dir/$name.shown" 2>/dev/null || echo 0)
  while :; do
    lines=$(wc -l < "$log"); [ "$lines" -gt "$shown" ] && { sed -n "$((shown + 1)),${lines}p" "$log"; shown=$lines; echo "$shown" > "$dir/$name.shown"; }
    [ -f "$rc" ] && { echo "$name ended: exit $(cat "$rc")"; exit "$(cat "$rc")"; }
    [ "$(date +%s)" -ge "$end" ] && { echo "$name still running"; exit 3; }
    sleep 5
  done
  ;;
*) echo "usage: detached.sh start NAME CMD... | wait NAME SECONDS" >&2; exit 2 ;;
esac
