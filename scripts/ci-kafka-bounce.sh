#!/usr/bin/env bash
# Restart the broker that scripts/kafka.sh started, KEEPING its data: stop the
# JVM (SIGTERM: a controlled shutdown; SIGKILL after
# $SAFEACK_KAFKA_STOP_TIMEOUT s) and start the very same command line again on
# the same data dir, config and log. `scripts/kafka.sh restart` cannot be used
# for this: it is stop + start, and both wipe and re-format the data dir.
#
# Used by the chaos suite (SAFEACK_CHAOS_RESTART) to restart the broker in the
# middle of a run. Same environment as scripts/kafka.sh (SAFEACK_KAFKA_PORT,
# SAFEACK_KAFKA_DATA_DIR, ...). Waits until the broker logs "Kafka Server
# started" again and its port accepts connections; prints how long the broker
# was down on stderr. Exit 1 when there is no broker to restart or it does not
# come back within $SAFEACK_KAFKA_START_TIMEOUT s.
set -euo pipefail

HOST=127.0.0.1
PORT=${SAFEACK_KAFKA_PORT:-29092}
DATA_DIR=${SAFEACK_KAFKA_DATA_DIR:-${TMPDIR:-/tmp}/safeack-kafka-$PORT}
START_TIMEOUT=${SAFEACK_KAFKA_START_TIMEOUT:-90}
STOP_TIMEOUT=${SAFEACK_KAFKA_STOP_TIMEOUT:-30}
PID_FILE="$DATA_DIR/kafka.pid"
LOG_FILE="$DATA_DIR/kafka.log"
TAG="-Dsafeack.kafka.datadir=$DATA_DIR"

log() { printf 'ci-kafka-bounce: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

is_ours() { [[ -r "/proc/$1/cmdline" ]] && tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -Fxq -- "$TAG"; }
alive() { kill -0 "$1" 2>/dev/null; }
tcp_open() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

[[ -f "$DATA_DIR/.safeack-kafka" ]] || die "no broker data dir at $DATA_DIR (start one with scripts/kafka.sh start)"
pid=$(tr -dc '0-9' <"$PID_FILE" 2>/dev/null || true)
if [[ -z "$pid" ]] || ! is_ours "$pid"; then
  pid=""
  for d in /proc/[0-9]*; do
    if is_ours "${d#/proc/}"; then pid=${d#/proc/}; break; fi
  done
fi
[[ -n "$pid" ]] || die "no broker running for $DATA_DIR"

# The exact command line of the running JVM, to start it again.
mapfile -d '' -t argv <"/proc/$pid/cmdline"
((${#argv[@]} > 1)) || die "cannot read the command line of pid $pid"
cwd=$(readlink "/proc/$pid/cwd" || printf '/')
started_before=$(grep -c 'Kafka Server started' "$LOG_FILE" 2>/dev/null || true)

t0=$SECONDS
log "stopping broker pid $pid (data kept in $DATA_DIR) ..."
kill -TERM "$pid" 2>/dev/null || true
deadline=$((SECONDS + STOP_TIMEOUT))
while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
if alive "$pid"; then
  log "broker did not stop within ${STOP_TIMEOUT}s, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  while alive "$pid"; do sleep 0.1; done
fi
stopped=$((SECONDS - t0))

# As scripts/kafka.sh starts it: detached, all output to the log, pid file
# written by the shell that then execs java. Not from a subshell: a
# backgrounded command in ( ... & ) keeps the caller's stdout pipe open, and
# a caller reading our output (a test's CombinedOutput, a $(...)) would wait
# for the broker to exit.
printf '\n[%s] ci-kafka-bounce: restarting with the same data\n' "$(date '+%F %T')" >>"$LOG_FILE"
# shellcheck disable=SC2016 # expanded by the inner bash
launcher=(bash -c 'echo $$ >"$1"; shift; exec "$@"' safeack-kafka "$PID_FILE" "${argv[@]}")
cd "$cwd"
if command -v setsid >/dev/null 2>&1; then
  nohup setsid "${launcher[@]}" </dev/null >>"$LOG_FILE" 2>&1 &
else
  nohup "${launcher[@]}" </dev/null >>"$LOG_FILE" 2>&1 &
fi

deadline=$((SECONDS + START_TIMEOUT))
while ((SECONDS < deadline)); do
  now=$(grep -c 'Kafka Server started' "$LOG_FILE" 2>/dev/null || true)
  if ((now > started_before)) && tcp_open "$HOST" "$PORT"; then
    log "broker back after $((SECONDS - t0)) s (stopping took ${stopped} s)"
    exit 0
  fi
  newpid=$(tr -dc '0-9' <"$PID_FILE" 2>/dev/null || true)
  if [[ -n "$newpid" && "$newpid" != "$pid" ]] && ! alive "$newpid"; then
    tail -n 50 "$LOG_FILE" >&2 || true
    die "restarted broker (pid $newpid) exited"
  fi
  sleep 0.3
done
tail -n 50 "$LOG_FILE" >&2 || true
die "broker did not come back within ${START_TIMEOUT}s"
