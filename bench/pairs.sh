#!/usr/bin/env bash
# Runs the given workloads on the given implementations ROUNDS times, one
# run of each per round, and prints a line per round: on a shared, noisy
# machine the ratio within a round (same minute) says more than the ratio
# of two medians taken minutes apart.
#   ./pairs.sh [ROUNDS] [WORKLOADS] [IMPLS]
#   ./pairs.sh 12 W1,W3 floor,broker,watermill
set -euo pipefail
cd "$(dirname "$0")"
rounds=${1:-12}
workloads=${2:-W1,W3}
impls=${3:-floor,broker}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/benchtable" ./cmd/benchtable
for r in $(seq "$rounds"); do
	"$tmp/benchtable" -n 100000 -min-time 250ms -count 1 -impls "$impls" -workloads "$workloads" \
		-sweep=false -queued 0 -out "$tmp/table.md" 2>&1 |
		awk -v r="$r" '/ ns\/msg/ { line = line sprintf(" %s/%s=%s", $1, $2, $3) } END { print "round " r ":" line }'
done
