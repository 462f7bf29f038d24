#!/usr/bin/env bash
# Compares the benchmark cells of two revisions on this machine: builds the
# bench test binary of REV (in a temporary git worktree) and of the working
# tree, runs them alternately ROUNDS times, and prints benchstat's table.
# Alternating and a significance test are what make a 5–10% change visible
# on a shared, noisy machine, where two runs minutes apart differ by 20–30%.
#   ./ab.sh REV [PATTERN] [BENCHTIME] [ROUNDS]
#   ./ab.sh HEAD~1 'Workloads/W[123]/broker$' 1000000x 8
# With NEW=REV2 in the environment, the new side is REV2 instead of the
# working tree (to measure one commit of several: NEW=C ./ab.sh C~1 ...).
set -euo pipefail
cd "$(dirname "$0")"
rev=${1:?usage: ./ab.sh REV [PATTERN] [BENCHTIME] [ROUNDS]}
pat=${2:-'Workloads/W[123]/(broker|broker-nodedup)$'}
benchtime=${3:-1000000x}
rounds=${4:-6}
benchstat_version=v0.0.0-20260908200009-22c9c6c9d4da

tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/old" >/dev/null 2>&1 || true; git worktree remove --force "$tmp/new" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/old" "$rev"
(cd "$tmp/old/bench" && go test -c -o "$tmp/old.test" .)
if [ -n "${NEW:-}" ]; then
	git worktree add -q --detach "$tmp/new" "$NEW"
	(cd "$tmp/new/bench" && go test -c -o "$tmp/new.test" .)
else
	go test -c -o "$tmp/new.test" .
fi
for r in $(seq "$rounds"); do
	for side in old new; do
		"$tmp/$side.test" -test.run '^$' -test.bench "$pat" -test.benchtime "$benchtime" -test.count 1 |
			grep '^Benchmark' >>"$tmp/$side.txt"
	done
	echo "round $r of $rounds" >&2
done
(cd "$tmp" && go run "golang.org/x/perf/cmd/benchstat@$benchstat_version" old=old.txt new=new.txt) | sed -n '1,/^$/p'
