#!/usr/bin/env bash
# Three-node Apache Kafka cluster (KRaft; each node a combined
# broker+controller process) on loopback, for failover tests: replication
# factor 3, min.insync.replicas 2. Kafka 4.1.2 by default, or the version
# SAFEACK_KAFKA_VERSION names (as scripts/kafka.sh: 3.9.x or 4.x). The jars
# and each node's server.properties are scripts/kafka.sh's (Maven Central
# through scripts/kafka/pom.xml, cached in ~/.cache/safeack; one config
# generator for the single broker and the nodes); no Docker, no Kafka tarball.
#
# Usage: scripts/kafka-cluster.sh COMMAND
#
#   start         resolve the jars (first time only), format fresh storage for
#                 the three nodes, start them in the background and wait until
#                 the cluster reports all three brokers. On success prints one
#                 line on stdout (everything else goes to stderr):
#                   SAFEACK_KAFKA_BROKERS=127.0.0.1:29300,... SAFEACK_CHAOS_CLUSTER=DIR/ctl
#                 so that
#                   eval "export $(scripts/kafka-cluster.sh start)"
#                 exports both. Already running -> prints the same line, exit 0
#                 (a cluster of another version there -> error, exit 1).
#   stop          stop every node (SIGCONT first, for a paused one; SIGTERM;
#                 SIGKILL after $SAFEACK_CLUSTER_STOP_GRACE s) and remove the
#                 data dir. Idempotent.
#   status        one line per node (see nodes) on stderr, the env line on
#                 stdout; exit 0 when all three run and answer, 3 when none
#                 runs, 1 otherwise.
#   env           print the env line (as start does), whether or not it runs.
#   nodes         one line per node on stdout: ID STATE PID HOST:PORT, STATE
#                 being running, paused (SIGSTOP) or down (PID then "-").
#   wait [SECS]   wait until every node runs and the cluster reports all three
#                 brokers unfenced (default $SAFEACK_KAFKA_START_TIMEOUT s).
#   node ID start    start node ID (1-3) again on its data, config and log,
#                    with the command line it first started with; waits until
#                    it logs "Kafka Server started" and its port answers.
#   node ID stop     SIGTERM (controlled shutdown), SIGKILL after
#                    $SAFEACK_KAFKA_STOP_TIMEOUT s; keeps the data.
#   node ID restart  stop, then start.
#   node ID kill     SIGKILL; waits until the process is gone.
#   node ID pause    SIGSTOP: a hung broker, not a dead one (connections stay
#                    open and unanswered).
#   node ID resume   SIGCONT.
#   node ID pid      print the pid (exit 3 when down).
#   logs ID       print the last 50 (or $SAFEACK_KAFKA_LOG_LINES) lines of
#                 node ID's log.
#   run CLASS     run a Kafka tool class on the cached classpath.
#
# DIR/ctl, written by start, is this script with the cluster's settings
# fixed: SAFEACK_CHAOS_CLUSTER names it for the chaos suite (chaos/doc.go),
# which runs `ctl nodes` and `ctl node ID start|stop|kill|...` (and signals
# the pids `nodes` prints directly when timing matters).
#
# Ports: node ID's broker listens on SAFEACK_CLUSTER_PORT+ID-1, its
# controller on SAFEACK_CLUSTER_CONTROLLER_PORT+ID-1. All of them must lie
# below Linux's ephemeral range (see scripts/kafka.sh: a client retrying a
# restarting node's port could otherwise connect to itself and hold it), and
# none may be a single broker's (29092/29093 for developers; in CI
# 29192/29193 for 4.1.2, 29292/29293 for 3.9.2, 29592/29593 for 4.4.0,
# 29692/29693 for the secured 4.4.0; or the
# current SAFEACK_KAFKA_PORT and its controller port).
#
# Environment (all optional):
#   SAFEACK_CLUSTER_PORT             first broker port               (29300)
#   SAFEACK_CLUSTER_CONTROLLER_PORT  first controller port           (PORT+10)
#   SAFEACK_CLUSTER_DATA_DIR         data dir, one nodeID/ per node
#                                    (${TMPDIR:-/tmp}/safeack-kafka-cluster-PORT)
#   SAFEACK_CLUSTER_STOP_GRACE       stop: seconds between SIGTERM and SIGKILL (15)
#   SAFEACK_CLUSTER_EXTRA_PROPS      extra server.properties lines for every node
#   and scripts/kafka.sh's SAFEACK_KAFKA_VERSION (4.1.2),
#   SAFEACK_KAFKA_CACHE, SAFEACK_KAFKA_HEAP (512m a
#   node), SAFEACK_KAFKA_JAVA, SAFEACK_KAFKA_START_TIMEOUT (90),
#   SAFEACK_KAFKA_STOP_TIMEOUT (30), SAFEACK_KAFKA_JVM_OPTS, SAFEACK_KAFKA_MVN.
set -euo pipefail
CLUSTER_SCRIPT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)/$(basename -- "${BASH_SOURCE[0]}")
# shellcheck source=SCRIPTDIR/kafka.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/kafka.sh"
log() { printf 'kafka-cluster.sh: %s\n' "$*" >&2; }
[[ "$SECURITY" == plaintext ]] ||
  die "SAFEACK_KAFKA_SECURITY=$SECURITY is for scripts/kafka.sh's single broker; the cluster runs plaintext (unset it)"

NODES=3
# The single broker's ports as scripts/kafka.sh sees them now, before the
# per-node settings below replace its globals.
SINGLE_PORTS=(29092 29093 29192 29193 29292 29293 29592 29593 29692 29693 "$PORT" "$CONTROLLER_PORT")
CPORT=${SAFEACK_CLUSTER_PORT:-29300}
CCPORT=${SAFEACK_CLUSTER_CONTROLLER_PORT:-$((CPORT + 10))}
CDIR=${SAFEACK_CLUSTER_DATA_DIR:-${TMPDIR:-/tmp}/safeack-kafka-cluster-$CPORT}
CMARKER="$CDIR/.safeack-kafka-cluster"
CTL="$CDIR/ctl"
STOP_GRACE=${SAFEACK_CLUSTER_STOP_GRACE:-15}

broker_port() { printf '%s\n' "$((CPORT + $1 - 1))"; }
controller_port() { printf '%s\n' "$((CCPORT + $1 - 1))"; }

bootstrap() {
  local i out=()
  for ((i = 1; i <= NODES; i++)); do out+=("$HOST:$(broker_port "$i")"); done
  (IFS=,; printf '%s\n' "${out[*]}")
}

# env_line prints the two variables on one line, unquoted, so that both
# `eval "export $(... start)"` and `export $(... start)` work; check_dir
# keeps the path plain.
env_line() {
  printf 'SAFEACK_KAFKA_BROKERS=%s SAFEACK_CHAOS_CLUSTER=%s\n' "$(bootstrap)" "$CTL"
}

check_dir() {
  [[ "$CDIR" =~ ^[A-Za-z0-9_./+-]+$ ]] ||
    die "data dir '$CDIR' has characters other than letters, digits and _./+-; set SAFEACK_CLUSTER_DATA_DIR"
}

check_ports() {
  [[ "$CPORT" =~ ^[0-9]+$ && "$CCPORT" =~ ^[0-9]+$ ]] ||
    die "SAFEACK_CLUSTER_PORT ($CPORT) and SAFEACK_CLUSTER_CONTROLLER_PORT ($CCPORT) must be numbers"
  local lo=32768 hi=60999 p i s
  if [[ -r /proc/sys/net/ipv4/ip_local_port_range ]]; then
    read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  fi
  local ports=()
  for ((i = 1; i <= NODES; i++)); do ports+=("$(broker_port "$i")" "$(controller_port "$i")"); done
  for p in "${ports[@]}"; do
    ((p >= 1024 && p < 65536)) || die "port $p out of range (SAFEACK_CLUSTER_PORT / SAFEACK_CLUSTER_CONTROLLER_PORT)"
    ((p < lo || p > hi)) ||
      die "port $p lies in the ephemeral port range $lo-$hi: a client retrying a restarting node could connect to itself and hold it; pick SAFEACK_CLUSTER_PORT below $lo"
    for s in "${SINGLE_PORTS[@]}"; do
      [[ "$p" != "$s" ]] ||
        die "port $p is a single broker's (scripts/kafka.sh: 29092/29093, CI 29192/29193, 29292/29293, 29592/29593, 29692/29693, SAFEACK_KAFKA_PORT); pick another SAFEACK_CLUSTER_PORT"
    done
  done
  local dup
  dup=$(printf '%s\n' "${ports[@]}" | sort | uniq -d | tr '\n' ' ')
  [[ -z "$dup" ]] || die "broker and controller ports overlap (${dup% }): SAFEACK_CLUSTER_CONTROLLER_PORT must be at least SAFEACK_CLUSTER_PORT+$NODES"
}

# use_node ID points scripts/kafka.sh's per-broker globals at node ID.
use_node() {
  NODE=$1
  [[ "$NODE" =~ ^[1-9][0-9]*$ ]] && ((NODE <= NODES)) || die "no node '$1' (nodes are 1-$NODES)"
  DATA_DIR="$CDIR/node$NODE"
  PID_FILE="$DATA_DIR/kafka.pid"
  LOG_FILE="$DATA_DIR/kafka.log"
  CONFIG="$DATA_DIR/server.properties"
  MARKER="$CMARKER"
  TAG="-Dsafeack.kafka.datadir=$DATA_DIR"
  NODE_PORT=$(broker_port "$NODE")
  NODE_CPORT=$(controller_port "$NODE")
}

# node_pid: the pid of the current node's JVM, from its pid file only (every
# launch writes it; no /proc scan, so `nodes` stays quick), or nothing.
node_pid() {
  local pid=""
  [[ -f "$PID_FILE" ]] && pid=$(tr -dc '0-9' <"$PID_FILE" || true)
  if [[ -n "$pid" ]] && alive "$pid" && is_ours "$pid"; then
    printf '%s\n' "$pid"
  fi
  return 0
}

node_state() { # pid -> running | paused | down
  local pid=$1
  if [[ -z "$pid" ]]; then
    echo down
  elif [[ "$(proc_state "$pid")" == T ]]; then
    echo paused
  else
    echo running
  fi
}

# node_config writes the current node's server.properties with
# scripts/kafka.sh's generator (write_node_config).
node_config() {
  local i voters=()
  for ((i = 1; i <= NODES; i++)); do voters+=("$i@$HOST:$(controller_port "$i")"); done
  write_node_config "$NODE" "$NODE_PORT" "$NODE_CPORT" "$(IFS=,; echo "${voters[*]}")" "$NODES" \
    "${SAFEACK_CLUSTER_EXTRA_PROPS:-}"
}

write_ctl() {
  {
    printf '#!/usr/bin/env bash\n'
    printf '# generated by scripts/kafka-cluster.sh: controls the cluster in this directory\n'
    printf '# (see scripts/kafka-cluster.sh for the commands)\n'
    printf 'export SAFEACK_CLUSTER_PORT=%q SAFEACK_CLUSTER_CONTROLLER_PORT=%q SAFEACK_CLUSTER_DATA_DIR=%q\n' \
      "$CPORT" "$CCPORT" "$CDIR"
    printf 'export SAFEACK_KAFKA_VERSION=%q SAFEACK_KAFKA_CACHE=%q\n' "$KAFKA_VERSION" "$CACHE"
    printf 'exec %q "$@"\n' "$CLUSTER_SCRIPT"
  } >"$CTL"
  chmod +x "$CTL"
}

started_count() { grep -c 'Kafka Server started' "$LOG_FILE" 2>/dev/null || true; }

# launch_node starts the current node with the command line saved in
# DATA_DIR/cmdline (NUL-separated) by start.
launch_node() {
  local argv
  mapfile -d '' -t argv <"$DATA_DIR/cmdline"
  ((${#argv[@]} > 1)) || die "node $NODE: no saved command line in $DATA_DIR/cmdline"
  printf '\n[%s] kafka-cluster.sh: starting node %s\n' "$(date '+%F %T')" "$NODE" >>"$LOG_FILE"
  # The launcher writes the new pid in the background: until it has, the
  # file must not name the previous (dead) process.
  rm -f -- "$PID_FILE"
  (cd "$CDIR" && launch_detached "${argv[@]}")
}

# wait_node_started BEFORE DEADLINE: until the node logged "Kafka Server
# started" more than BEFORE times and its port answers; dies with its log
# when it exits or DEADLINE (in $SECONDS) passes.
wait_node_started() {
  local before=$1 deadline=$2 pid
  while ((SECONDS < deadline)); do
    if (($(started_count) > before)) && tcp_open "$HOST" "$NODE_PORT"; then
      return 0
    fi
    [[ -s "$PID_FILE" ]] && pid=$(tr -dc '0-9' <"$PID_FILE" 2>/dev/null || true) || pid=""
    if [[ -n "$pid" ]] && ! alive "$pid"; then
      tail_log 50
      die "node $NODE (pid $pid) exited during startup (log: $LOG_FILE)"
    fi
    sleep 0.3
  done
  tail_log 50
  die "node $NODE did not start within ${START_TIMEOUT}s (log: $LOG_FILE; it may still be starting: '$0 nodes', or '$0 node $NODE stop'; a loaded machine needs a larger SAFEACK_KAFKA_START_TIMEOUT)"
}

# brokers_unfenced: how many brokers the cluster's metadata lists (only
# unfenced brokers are listed), asked through any node that answers.
brokers_unfenced() {
  local out i
  for ((i = 1; i <= NODES; i++)); do
    tcp_open "$HOST" "$(broker_port "$i")" || continue
    if out=$(run_tool_timeout 30 "$API_VERSIONS_CLASS" \
        --bootstrap-server "$HOST:$(broker_port "$i")" 2>>"$CDIR/check.log"); then
      grep -c '(id: [0-9]* rack' <<<"$out" || true
      return 0
    fi
  done
  echo 0
}

cmd_wait() {
  local secs=${1:-$START_TIMEOUT} deadline n=0 i pid
  deadline=$((SECONDS + secs))
  while ((SECONDS < deadline)); do
    local up=0
    for ((i = 1; i <= NODES; i++)); do
      use_node "$i"
      pid=$(node_pid)
      [[ -n "$pid" && "$(node_state "$pid")" == running ]] && tcp_open "$HOST" "$NODE_PORT" && up=$((up + 1))
    done
    if ((up == NODES)); then
      n=$(brokers_unfenced)
      ((n == NODES)) && return 0
    fi
    sleep 0.5
  done
  die "the cluster did not report $NODES unfenced brokers within ${secs}s (last: $n; see $CDIR/check.log)"
}

# ---------------------------------------------------------------- commands ---

cmd_start() {
  check_java
  check_ports
  check_dir
  local i pid running=0
  if [[ -f "$CMARKER" ]]; then
    check_running_version "$CDIR/version"
    for ((i = 1; i <= NODES; i++)); do
      use_node "$i"
      [[ -n "$(node_pid)" ]] && running=$((running + 1))
    done
    if ((running == NODES)); then
      log "cluster already running (data dir $CDIR)"
      env_line
      return 0
    fi
    ((running == 0)) ||
      die "$running of $NODES nodes run for $CDIR: start the others with '$0 node ID start', or '$0 stop' first"
  fi
  for ((i = 1; i <= NODES; i++)); do
    for p in "$(broker_port "$i")" "$(controller_port "$i")"; do
      tcp_open "$HOST" "$p" &&
        die "port $HOST:$p is already in use by another process (set SAFEACK_CLUSTER_PORT / SAFEACK_CLUSTER_CONTROLLER_PORT)"
    done
  done

  resolve_jars

  if [[ -e "$CDIR" ]]; then
    [[ -f "$CMARKER" ]] || die "$CDIR exists but was not created by kafka-cluster.sh (no $CMARKER); not removing it"
    rm -rf -- "$CDIR"
  fi
  mkdir -p "$CDIR"
  : >"$CMARKER"
  write_ctl
  printf '%s\n' "$KAFKA_VERSION" >"$CDIR/version"
  local cluster_id
  cluster_id=$(random_cluster_id)
  printf '%s\n' "$cluster_id" >"$CDIR/cluster.id"

  local t0=$SECONDS fpids=()
  log "formatting storage of $NODES nodes in $CDIR (cluster id $cluster_id) ..."
  for ((i = 1; i <= NODES; i++)); do
    use_node "$i"
    node_config
    run_tool kafka.tools.StorageTool format --cluster-id "$cluster_id" \
      --config "$CONFIG" --ignore-formatted >"$DATA_DIR/format.log" 2>&1 &
    fpids+=($!)
  done
  for ((i = 1; i <= NODES; i++)); do
    if ! wait "${fpids[i - 1]}"; then
      cat "$CDIR/node$i/format.log" >&2 || true
      die "kafka-storage format failed for node $i"
    fi
  done

  log "starting Kafka $KAFKA_VERSION on $(bootstrap) (controllers from $HOST:$CCPORT, heap $HEAP each) ..."
  for ((i = 1; i <= NODES; i++)); do
    use_node "$i"
    broker_argv
    printf '%s\0' "${BROKER_ARGV[@]}" >"$DATA_DIR/cmdline"
    launch_node
  done

  local deadline=$((SECONDS + START_TIMEOUT))
  for ((i = 1; i <= NODES; i++)); do
    use_node "$i"
    if ! (wait_node_started 0 "$deadline"); then
      cmd_stop_all >/dev/null 2>&1 || true
      die "the cluster did not start (data dir removed; rerun with a larger SAFEACK_KAFKA_START_TIMEOUT if the machine is slow)"
    fi
  done
  if ! (cmd_wait $((deadline - SECONDS > 10 ? deadline - SECONDS : 10))); then
    cmd_stop_all >/dev/null 2>&1 || true
    die "the cluster started but did not report $NODES brokers"
  fi
  use_node 1 # the tool JVM logs with its config, into its check.log
  if ! check_share_groups "$(bootstrap)"; then
    cmd_stop_all >/dev/null 2>&1 || true
    die "Kafka $KAFKA_VERSION started without share groups (data dir kept: $CDIR)"
  fi
  if ! wait_share_ready "$(bootstrap)"; then
    cmd_stop_all >/dev/null 2>&1 || true
    die "Kafka $KAFKA_VERSION: no share group could consume a record (data dir kept: $CDIR)"
  fi
  log "Kafka $KAFKA_VERSION cluster ready in $((SECONDS - t0)) s: $(bootstrap); control: $CTL"
  env_line
}

# cmd_stop_all stops every node at once, keeping the data dir.
cmd_stop_all() {
  local i pid pids=() deadline
  for ((i = 1; i <= NODES; i++)); do
    use_node "$i"
    pid=$(node_pid)
    [[ -n "$pid" ]] || pid=$(broker_pid) # pid file lost: scan /proc for the tag
    [[ -n "$pid" ]] || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid")
  done
  ((${#pids[@]} > 0)) || { log "cluster not running"; return 0; }
  log "stopping ${#pids[@]} node(s) (pids ${pids[*]}) ..."
  deadline=$((SECONDS + STOP_GRACE))
  for pid in "${pids[@]}"; do
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
  done
  for pid in "${pids[@]}"; do
    if alive "$pid"; then
      log "pid $pid did not stop within ${STOP_GRACE}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    alive "$pid" && die "could not kill pid $pid"
  done
  return 0
}

cmd_stop() {
  cmd_stop_all
  if [[ -e "$CDIR" ]]; then
    [[ -f "$CMARKER" ]] || die "$CDIR exists but was not created by kafka-cluster.sh (no $CMARKER); not removing it"
    rm -rf -- "$CDIR"
  fi
  return 0
}

cmd_nodes() {
  local i pid
  for ((i = 1; i <= NODES; i++)); do
    use_node "$i"
    pid=$(node_pid)
    printf '%s %s %s %s:%s\n' "$i" "$(node_state "$pid")" "${pid:--}" "$HOST" "$NODE_PORT"
  done
}

cmd_status() {
  [[ -f "$CMARKER" ]] || { log "not running (no $CDIR)"; return 3; }
  local i pid state up=0 down=0
  for ((i = 1; i <= NODES; i++)); do
    use_node "$i"
    pid=$(node_pid)
    state=$(node_state "$pid")
    if [[ "$state" == running ]] && tcp_open "$HOST" "$NODE_PORT"; then
      up=$((up + 1))
    fi
    [[ "$state" == down ]] && down=$((down + 1))
    log "node $i: $state${pid:+ (pid $pid)} on $HOST:$NODE_PORT, data $DATA_DIR"
  done
  env_line
  ((up == NODES)) && return 0
  ((down == NODES)) && return 3
  return 1
}

cmd_node() {
  [[ $# -ge 2 ]] || die "usage: $0 node ID start|stop|restart|kill|pause|resume|pid"
  [[ -f "$CMARKER" ]] || die "no cluster at $CDIR (start one with '$0 start')"
  use_node "$1"
  local action=$2 pid t0=$SECONDS deadline
  pid=$(node_pid)
  case "$action" in
    start)
      if [[ -n "$pid" ]]; then
        [[ "$(node_state "$pid")" == paused ]] && die "node $NODE (pid $pid) is paused: '$0 node $NODE resume'"
        log "node $NODE already running (pid $pid)"
        return 0
      fi
      tcp_open "$HOST" "$NODE_PORT" && die "port $HOST:$NODE_PORT is held by another process; node $NODE cannot start"
      local before
      before=$(started_count)
      launch_node
      wait_node_started "$before" $((SECONDS + START_TIMEOUT))
      log "node $NODE started in $((SECONDS - t0)) s (pid $(node_pid))"
      ;;
    stop)
      if [[ -z "$pid" ]]; then log "node $NODE not running"; return 0; fi
      kill -CONT "$pid" 2>/dev/null || true
      kill_broker "$pid"
      log "node $NODE stopped in $((SECONDS - t0)) s"
      ;;
    restart)
      cmd_node "$NODE" stop
      cmd_node "$NODE" start
      ;;
    kill)
      if [[ -z "$pid" ]]; then log "node $NODE not running"; return 0; fi
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while alive "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
      alive "$pid" && die "node $NODE (pid $pid) survived SIGKILL"
      log "node $NODE (pid $pid) killed"
      ;;
    pause)
      [[ -n "$pid" ]] || die "node $NODE is not running"
      kill -STOP "$pid"
      deadline=$((SECONDS + 10))
      while [[ "$(proc_state "$pid")" != T ]] && ((SECONDS < deadline)); do sleep 0.05; done
      log "node $NODE (pid $pid) paused"
      ;;
    resume)
      [[ -n "$pid" ]] || die "node $NODE is not running"
      kill -CONT "$pid"
      log "node $NODE (pid $pid) resumed"
      ;;
    pid)
      [[ -n "$pid" ]] || return 3
      printf '%s\n' "$pid"
      ;;
    *) die "unknown node action '$action' (start|stop|restart|kill|pause|resume|pid)" ;;
  esac
}

cluster_usage() { # exit code
  sed -n '2,/^set -euo/p' "$CLUSTER_SCRIPT" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

cluster_main() {
  [[ $# -ge 1 ]] || cluster_usage
  local cmd=$1
  shift
  case "$cmd" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) env_line ;;
    nodes) cmd_nodes ;;
    wait) check_java; cmd_wait "$@" ;;
    node) cmd_node "$@" ;;
    logs)
      [[ $# -ge 1 ]] || die "usage: $0 logs ID"
      use_node "$1"
      [[ -f "$LOG_FILE" ]] || die "no log at $LOG_FILE"
      tail -n "${SAFEACK_KAFKA_LOG_LINES:-50}" "$LOG_FILE"
      ;;
    run)
      [[ $# -ge 1 ]] || die "usage: $0 run CLASS [ARGS...]"
      check_java
      resolve_jars
      run_tool "$@"
      ;;
    -h | --help | help) cluster_usage 0 ;;
    *) log "unknown command '$cmd'"; cluster_usage ;;
  esac
}

cluster_main "$@"
