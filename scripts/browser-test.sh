#!/usr/bin/env bash
# Browser test of router_example's live page.
#
# Builds and starts router_example on its embedded broker, waits until
# /api/frontier shows partitions with committed offsets, then loads the page
# in headless Chromium twice:
#   1. `chromium --dump-dom` (virtual time): the page must have rendered data
#      (body data-rendered="true", one row per partition, the title naming
#      the partitions);
#   2. scripts/cdpshot (DevTools protocol, real time): waits for the drawing,
#      preferably with a slow head holding a partition back, and saves
#      .artifacts/live-page.png (copied to docs/live-page.png, the screenshot in
#      docs/operations.md, only with UPDATE_DOCS=1).
# Finally it stops the example with SIGINT and checks it drained and exited 0.
#
# Installs Debian's chromium when it is missing (apt-get, as root or through
# sudo). Environment: CHROMIUM (binary), UPDATE_DOCS=1 (refresh the tracked
# docs/live-page.png; by default no tracked file changes), SHOT_WAIT
# (real-time wait before the screenshot, 12s). Like router_example, it uses
# the cluster SAFEACK_KAFKA_BROKERS names, when set, instead of the embedded
# broker.
set -euo pipefail
cd "$(dirname "$0")/.."

ART=.artifacts
mkdir -p "$ART" docs
LOG="$ART/router_example.log"

say() { printf '%s\n' "browser-test: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }

# --- Chromium -----------------------------------------------------------
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$CHROMIUM" ]; then
  say "installing Debian's chromium"
  SUDO=
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "chromium is missing and this is not root (no sudo either)"
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y --no-install-recommends chromium >"$ART/apt.log" 2>&1; then
    $SUDO apt-get update >>"$ART/apt.log" 2>&1
    $SUDO apt-get install -y --no-install-recommends chromium >>"$ART/apt.log" 2>&1 || {
      tail -20 "$ART/apt.log" >&2
      die "cannot install chromium"
    }
  fi
  CHROMIUM=$(command -v chromium)
fi
# Headless flags for a machine without display and without outside network.
FLAGS=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
  --disable-background-networking --disable-component-update --disable-sync
  --disable-dev-shm-usage --hide-scrollbars)
say "using $("$CHROMIUM" --version 2>/dev/null | head -1)"

# --- build and start the example ----------------------------------------
go build -o "$ART/router_example" ./router_example
go build -o "$ART/cdpshot" ./scripts/cdpshot

UDD=$(mktemp -d)
APP=
cleanup() {
  if [ -n "$APP" ] && kill -0 "$APP" 2>/dev/null; then
    kill -INT "$APP" 2>/dev/null || true
    wait "$APP" 2>/dev/null || true
  fi
  rm -rf "$UDD"
}
trap cleanup EXIT

"$ART/router_example" -duration 180s -http 127.0.0.1:0 >"$LOG" 2>&1 &
APP=$!

ADDR=
for _ in $(seq 1 300); do
  ADDR=$(sed -n 's|^live page: http://\([^/]*\)/.*|\1|p' "$LOG" | head -1)
  [ -n "$ADDR" ] && break
  kill -0 "$APP" 2>/dev/null || { cat "$LOG" >&2; die "router_example exited early"; }
  sleep 0.1
done
[ -n "$ADDR" ] || { cat "$LOG" >&2; die "router_example did not announce its HTTP address"; }
URL="http://$ADDR/"
say "router_example serves $URL"

# --- wait for data --------------------------------------------------------
api() { curl -fsS --max-time 2 "${URL}api/frontier" 2>/dev/null || true; }
ok=
for _ in $(seq 1 300); do
  body=$(api)
  # Partitions are assigned and at least one has a confirmed commit > 0.
  if grep -q '"partitions":\[{' <<<"$body" && grep -Eq '"committed":[1-9]' <<<"$body"; then
    ok=1
    break
  fi
  sleep 0.1
done
[ -n "$ok" ] || { tail -20 "$LOG" >&2; die "/api/frontier never showed committed offsets"; }
parts=$(grep -o '"partition":[0-9]*' <<<"$body" | wc -l)
say "/api/frontier shows $parts partitions with commits"
metrics=$(curl -fsS --max-time 5 "${URL}metrics") || die "/metrics does not answer"
grep -q '^safeack_confirmed_offset{' <<<"$metrics" || die "/metrics lacks safeack_confirmed_offset"

# --- 1. the DOM after rendering -------------------------------------------
"$CHROMIUM" "${FLAGS[@]}" --user-data-dir="$UDD/dom" --window-size=1280,800 \
  --virtual-time-budget=5000 --dump-dom "$URL" >"$ART/live-page.dom.html" 2>"$ART/chromium-dom.log" ||
  die "chromium --dump-dom failed (see $ART/chromium-dom.log)"
DOM="$ART/live-page.dom.html"
grep -q 'data-rendered="true"' "$DOM" || die "the page never rendered data (no data-rendered=\"true\" in $DOM)"
drawn=$(grep -o 'data-partitions="[0-9]*"' "$DOM" | head -1 | grep -o '[0-9]*' || true)
rows=$(grep -o 'class="row[ "]' "$DOM" | wc -l)
title=$(sed -n 's|.*<title>\(.*\)</title>.*|\1|p' "$DOM" | head -1)
[ "${drawn:-0}" -ge 1 ] || die "data-partitions is ${drawn:-missing}"
[ "$rows" -eq "$drawn" ] || die "$rows rows drawn for $drawn partitions"
case "$title" in *"$drawn partitions"*) ;; *) die "title \"$title\" does not name $drawn partitions" ;; esac
say "DOM: \"$title\", $rows partition rows"

# --- 2. a screenshot in real time ----------------------------------------
report=$("$ART/cdpshot" -chromium "$CHROMIUM" -url "$URL" -out "$ART/live-page.png" \
  -width 1280 -height 800 -timeout 90s \
  -ready 'document.body.dataset.rendered === "true" && document.querySelectorAll(".row").length > 0' \
  -prefer 'document.querySelector(".row.held") !== null' -prefer-timeout 30s \
  -min-wait "${SHOT_WAIT:-12s}" \
  -report '({title: document.title, rows: document.querySelectorAll(".row").length, held: document.querySelectorAll(".row.held").length, status: document.getElementById("status-text").textContent})' \
  2>"$ART/cdpshot.log") || { cat "$ART/cdpshot.log" >&2; die "cdpshot failed"; }
say "screenshot: $report"
grep -q '"status":"live"' <<<"$report" || die "the page was not live when shot: $report"
[ -s "$ART/live-page.png" ] || die "no screenshot"
if [ -n "${UPDATE_DOCS:-}" ]; then
  cp "$ART/live-page.png" docs/live-page.png
  say "updated docs/live-page.png"
fi

# --- stop and drain --------------------------------------------------------
kill -INT "$APP"
rc=0
wait "$APP" || rc=$?
APP=
[ "$rc" -eq 0 ] || { tail -20 "$LOG" >&2; die "router_example exited with $rc after SIGINT"; }
grep -q '^committed/end of log:' "$LOG" || { tail -20 "$LOG" >&2; die "router_example did not report its final commits"; }
say "router_example drained and exited: $(grep -A1 '^committed/end of log:' "$LOG" | head -1)"
say "PASS: $ART/live-page.png"
