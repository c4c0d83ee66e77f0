#!/usr/bin/env bash
# Restart the broker that scripts/kafka.sh started, KEEPING its data: stop the
# JVM (SIGTERM: a controlled shutdown; SIGKILL after
# $SAFEACK_KAFKA_STOP_TIMEOUT s) and start the very same command line again on
# the same data dir, config and log. `scripts/kafka.sh restart` cannot be used
# for this: it is stop + start, and both wipe and re-format the data dir.
#
# Used by the chaos suite (SAFEACK_CHAOS_RESTART) to restart the broker in the
# middle of a run. Same environment as scripts/kafka.sh, whose settings and
# process helpers it uses. Waits until the broker logs "Kafka Server started"
# again and its port accepts connections; prints how long the broker was down
# on stderr. Exit 1 when there is no broker to restart or it does not come
# back within $SAFEACK_KAFKA_START_TIMEOUT s.
set -euo pipefail
# shellcheck source=SCRIPTDIR/kafka.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/kafka.sh"
log() { printf 'ci-kafka-bounce: %s\n' "$*" >&2; }

[[ -f "$MARKER" ]] || die "no broker data dir at $DATA_DIR (start one with scripts/kafka.sh start)"
pid=$(broker_pid)
[[ -n "$pid" ]] || die "no broker running for $DATA_DIR"

# The exact command line of the running JVM, to start it again.
mapfile -d '' -t argv <"/proc/$pid/cmdline"
((${#argv[@]} > 1)) || die "cannot read the command line of pid $pid"
cwd=$(readlink "/proc/$pid/cwd" || printf '/')
started_before=$(grep -c 'Kafka Server started' "$LOG_FILE" 2>/dev/null || true)

t0=$SECONDS
log "data kept in $DATA_DIR"
kill_broker "$pid"
stopped=$((SECONDS - t0))

printf '\n[%s] ci-kafka-bounce: restarting with the same data\n' "$(date '+%F %T')" >>"$LOG_FILE"
cd "$cwd"
launch_detached "${argv[@]}"

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
