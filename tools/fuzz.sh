#!/usr/bin/env bash
# Runs every fuzz target of the module for a while each: tools/fuzz.sh [fuzztime] [workers].
# Targets are found by name (func FuzzXxx in *_test.go), so a new one needs no registration.
# A crash stops the run; its input is written to the package's testdata/fuzz/FuzzXxx/, where
# committing it keeps it as a regression test of the plain `go test`.
#
# Go before 1.27 has a race in its fuzzing coordinator (go.dev/issue/75804): when -fuzztime
# runs out while a worker is busy, the target can fail with a bare "context deadline exceeded"
# and no input written. Such a run is not a finding: the script replays the target's corpus
# and, when that passes, counts the run as the coordinator's and goes on. Any other failure,
# or one that wrote an input, stops the run.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
workers=${2:-1}
GO=${GO:-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
corpus_files() { if [ -d "$1" ]; then find "$1" -type f | sort; fi; }
mapfile -t files < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '^./tools/' | sort)
deadline_races=0
for file in "${files[@]}"; do
	dir=$(dirname "$file")
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]*' "$file" | cut -d' ' -f2); do
		echo "== $dir $target ($fuzztime)"
		before=$(corpus_files "$dir/testdata/fuzz/$target")
		if "$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -parallel "$workers" "$dir" 2>&1 | tee "$out"; then
			continue
		fi
		after=$(corpus_files "$dir/testdata/fuzz/$target")
		failures=$(grep -A3 -- "--- FAIL: $target" "$out" | sed -n '2,$p' | grep -vE '^(FAIL|exit status|ok )' || true)
		if [ "$before" = "$after" ] && [ "$(echo "$failures" | sed 's/^[[:space:]]*//')" = "context deadline exceeded" ]; then
			echo "== $target: the fuzzing coordinator's deadline race (go.dev/issue/75804), no input written; replaying the corpus"
			"$GO" test -count=1 -run "^${target}\$" "$dir"
			deadline_races=$((deadline_races + 1))
			continue
		fi
		echo "== $target failed"
		exit 1
	done
done
echo "== every fuzz target ran ($deadline_races ended in the coordinator's deadline race and replayed clean)"
