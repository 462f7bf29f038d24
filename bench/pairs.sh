#!/usr/bin/env bash
# Runs the given workloads on the given implementations ROUNDS times, one
# run of each per round, and prints a line per round: on a shared, noisy
# machine the ratio within a round (same minute) says more than the ratio
# of two medians taken minutes apart. When floor is among the
# implementations, each other cell shows its ratio to the floor of the same
# round and workload, and a summary at the end gives the median, min and
# max of those ratios over the rounds.
#   ./pairs.sh [ROUNDS] [WORKLOADS] [IMPLS]
#   ./pairs.sh 12 W1,W3 floor,broker,watermill
#   ./pairs.sh 12 P1,P2,P3 floor,naive,broker,broker-nodedup,watermill,nats
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
		awk -v r="$r" -v ratios="$tmp/ratios" '
			$4 == "ns/msg" || $3 == "FAIL:" {
				n++; wl[n] = $1; im[n] = $2; v[n] = ($3 == "FAIL:") ? "FAIL" : $3
				if ($2 == "floor" && v[n] != "FAIL") floor[$1] = v[n]
			}
			END {
				line = ""
				for (i = 1; i <= n; i++) {
					s = sprintf(" %s/%s=%s", wl[i], im[i], v[i])
					if (im[i] != "floor" && v[i] != "FAIL" && (wl[i] in floor) && floor[wl[i]] > 0) {
						x = v[i] / floor[wl[i]]
						s = s sprintf("(×%.2f)", x)
						printf "%s %s %.4f\n", wl[i], im[i], x >> ratios
					}
					line = line s
				}
				print "round " r ":" line
			}'
done
if [[ -s "$tmp/ratios" ]]; then
	echo "ratio to the floor within a round, over the rounds: median (min–max)"
	sort -k1,1 -k2,2 -k3,3g "$tmp/ratios" | awk '
		function flush() { if (n) printf "  %s %s ×%.2f (%.2f–%.2f, %d rounds)\n", k1, k2, (n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2), x[1], x[n], n }
		$1 != k1 || $2 != k2 { flush(); k1 = $1; k2 = $2; n = 0 }
		{ x[++n] = $3 }
		END { flush() }'
fi
