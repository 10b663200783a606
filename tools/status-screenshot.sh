#!/bin/bash
# Regenerates docs/img/status.png from a real run: the seed-incident drill (mantle's side
# only, at real time) with the in-process mesh's HTTP port fixed by --http-addr, and a
# headless Chromium screenshot of /status once the primary's breaker is open and the
# backup answers (about two and a half minutes in: the incident starts at 2m).
#
# Usage: tools/status-screenshot.sh [out.png]   (needs /usr/bin/chromium: make deps-chromium)
set -eu
ADDR=${STATUS_ADDR:-127.0.0.1:18190}
OUT=${1:-docs/img/status.png}
BIN=$(mktemp -d)/mantle
go build -o "$BIN" ./cmd/mantle
"$BIN" drill --scenario seed-incident --sides mantle --time-scale 1 --duration 4m --out "" --http-addr "$ADDR" >/dev/null 2>&1 &
DRILL=$!
trap 'kill -INT $DRILL 2>/dev/null || true; wait $DRILL 2>/dev/null || true' EXIT
# One open breaker (the primary's) and a closed backup: the incident, handled.
for _ in $(seq 1 480); do
  if curl -sf "http://$ADDR/status?format=json" | grep -q '"open_breakers": 1,'; then break; fi
  sleep 0.5
done
sleep 5 # let degradations accumulate for the table
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --hide-scrollbars \
  --window-size=1280,900 --screenshot="$OUT" "http://$ADDR/status?refresh=0" 2>/dev/null
ls -l "$OUT"
