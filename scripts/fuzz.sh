#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 5s; `make fuzz
# FUZZTIME=5m` for a long hunt). Their seed corpora (and any input that once
# failed, under testdata/fuzz/) also run as plain tests in `make test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime="${FUZZTIME:-5s}"
targets=(
	"./service FuzzParseFilter"
	"./service FuzzPageToken"
	"./service FuzzParseName"
	"./service FuzzRequestID"
	"./server FuzzCreateCluster"
	"./server FuzzScaleCluster"
)
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	if go test "$pkg" -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" >"$log" 2>&1; then
		echo "fuzz $name ($pkg): $(grep -oE 'execs: [0-9]+' "$log" | tail -n 1) in $fuzztime, no failure"
	else
		cat "$log"
		echo "FAIL: fuzz $name ($pkg); the failing input is under $pkg/testdata/fuzz/$name/" >&2
		exit 1
	fi
done
