#!/usr/bin/env bash
# From the host: `sudo swml-bench ARGS` on every running worker VM of the lab at once
# (the ranks meet in the switch's join barrier), then each rank's output in turn.
#   cd vagrant && ./bench.sh --verify
#   ./bench.sh --size 16MiB --iterations 20 --backend udp
set -euo pipefail
cd "$(dirname "$0")"
prefix=$(sed -n 's/.*"hostname_prefix": *"\([^"]*\)".*/\1/p' cluster.json)
mapfile -t workers < <(vagrant status --machine-readable |
  awk -F, -v p="$prefix" '$3 == "state" && $4 == "running" && index($2, p) == 1 { print $2 }')
[ ${#workers[@]} -gt 0 ] || { echo "bench.sh: no running worker VMs (vagrant up first)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=$(printf ' %q' "$@")
echo "bench.sh: swml-bench${args} on ${workers[*]}" >&2
pids=()
for w in "${workers[@]}"; do
  vagrant ssh "$w" -c "sudo swml-bench$args" >"$out/$w" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!workers[@]}"; do
  wait "${pids[$i]}" || rc=1
  echo "=== ${workers[$i]}"
  cat "$out/${workers[$i]}"
done
exit $rc
