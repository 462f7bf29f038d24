#!/usr/bin/env bash
# Runs every workload on every implementation and writes the report to
# RESULTS.md and the throughput chart to chart.svg (both next to this
# script). Takes a few minutes on 2 cores. Knobs (environment):
#   N=100000        messages per cell (W4 and W6/64KiB publish 0.4×)
#   SWEEP_N=100000  deliveries per chart point
#   MIN_TIME=250ms  a faster cell is rerun with proportionally more messages
#   TIMEOUT=30s     limit per cell (a cell past it is a FAIL, never a hang)
#   COUNT=1         runs per table cell (the report shows the median)
#   IMPLS=...       comma-separated implementations
#   LAT_TIME=1s     measured traffic per latency cell (after a warm-up tenth)
#   LAT_IMPLS=...   comma-separated implementations for the latency cells
# Extra arguments go to the runner, e.g. ./run.sh -workloads W1,W2 -sweep=false
# (-latency=false leaves the latency cells out).
set -euo pipefail
cd "$(dirname "$0")"

N=${N:-100000}
SWEEP_N=${SWEEP_N:-100000}
MIN_TIME=${MIN_TIME:-250ms}
TIMEOUT=${TIMEOUT:-30s}
COUNT=${COUNT:-1}
IMPLS=${IMPLS:-floor,naive,broker,broker-nodedup,watermill,nats,jetstream}
LAT_TIME=${LAT_TIME:-1s}
LAT_IMPLS=${LAT_IMPLS:-floor,naive,broker,broker-nodedup,watermill,nats}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/benchtable" ./cmd/benchtable

start=$(date +%s)
"$tmp/benchtable" -n "$N" -sweep-n "$SWEEP_N" -min-time "$MIN_TIME" -timeout "$TIMEOUT" -count "$COUNT" \
	-impls "$IMPLS" -latency -latency-impls "$LAT_IMPLS" -latency-time "$LAT_TIME" \
	-out "$tmp/table.md" -chart "$tmp/chart.svg" "$@"
end=$(date +%s)

# Both files are written in place only once the run produced them (not,
# for example, after -h), so a failed run leaves the last results alone.
{
	echo "# Benchmark results"
	echo
	echo "Written by \`./run.sh\` ($((end - start)) s, \`nproc\` = $(nproc)). How to read it: [README.md](README.md). Chart: [chart.svg](chart.svg)."
	echo "Figures from a shared 2-core machine are noisy: compare within a row, and rerun before trusting a difference under ~30%."
	echo
	cat "$tmp/table.md"
} >"$tmp/RESULTS.md"
test -s "$tmp/chart.svg"
mv "$tmp/RESULTS.md" RESULTS.md
cp "$tmp/chart.svg" chart.svg
echo "wrote RESULTS.md and chart.svg in $((end - start)) s" >&2
