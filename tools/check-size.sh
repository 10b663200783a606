#!/usr/bin/env bash
# Fails when a tracked file is larger than MAX_KB (default 512 KiB), or when the commits since
# BASE (optional first argument) pack to more than MAX_PACK_MB (default 64 MiB). A submission
# has hard size limits, and data a test needs is made by the test at run time, never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
max_kb=${MAX_KB:-512}
max_pack_mb=${MAX_PACK_MB:-64}
status=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	kb=$(( ($(stat -c %s "$f") + 1023) / 1024 ))
	if [ "$kb" -gt "$max_kb" ]; then
		echo "too large to commit: $f ($kb KiB > $max_kb KiB): generate it at run time instead"
		status=1
	fi
done < <(git ls-files -z)
if [ -n "${1:-}" ]; then
	bytes=$(git rev-list --objects "$1..HEAD" | git pack-objects --stdout -q | wc -c)
	diffs=$(git log -p --format= "$1..HEAD" | wc -c)
	echo "since $1: packs to $((bytes / 1024)) KiB, diffs $((diffs / 1024)) KiB"
	if [ "$bytes" -gt $((max_pack_mb * 1024 * 1024)) ]; then
		echo "the commits since $1 pack to more than $max_pack_mb MiB"
		status=1
	fi
fi
[ "$status" -eq 0 ] && echo "file sizes are within $max_kb KiB"
exit "$status"
