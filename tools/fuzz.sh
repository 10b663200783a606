#!/usr/bin/env bash
# Runs every fuzz target of the module for a while each: tools/fuzz.sh [fuzztime] [workers].
# Targets are found by name (func FuzzXxx in *_test.go), so a new one needs no registration.
# A crash stops the run; its input is written to the package's testdata/fuzz/FuzzXxx/, where
# committing it keeps it as a regression test of the plain `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
workers=${2:-1}
GO=${GO:-go}
mapfile -t files < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '^./tools/' | sort)
for file in "${files[@]}"; do
	dir=$(dirname "$file")
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]*' "$file" | cut -d' ' -f2); do
		echo "== $dir $target ($fuzztime)"
		"$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -parallel "$workers" "$dir"
	done
done
