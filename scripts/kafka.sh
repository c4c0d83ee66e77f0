#!/usr/bin/env bash
# Single-node Apache Kafka broker (KRaft, combined broker+controller) on
# loopback, for integration tests: 4.1.2 by default, or the version
# SAFEACK_KAFKA_VERSION names (3.9.x, the last 3.x line, and any 4.x; tested:
# 3.9.2, 4.1.2, 4.4.0). No Docker, no Kafka tarball: the jars come from Maven
# Central through Maven (scripts/kafka/pom.xml) and are cached per version.
# Share groups (KIP-932) are on from 4.2: start checks it, and waits until a
# share group consumes a record (see wait_share_ready).
#
# Usage: scripts/kafka.sh start|stop|restart|status|fetch|classpath|logs|run CLASS [ARGS...]
#
#   start      resolve jars (first time only), format fresh storage, start the
#              broker in the background and wait until it answers. On success
#              prints `SAFEACK_KAFKA_BROKERS=127.0.0.1:PORT` on stdout (all
#              other messages go to stderr), so
#                eval "export $(scripts/kafka.sh start)"
#              exports it. A secured broker (SAFEACK_KAFKA_SECURITY=sasl_ssl)
#              prints, on the same line, what its clients need too:
#                SAFEACK_KAFKA_BROKERS=127.0.0.1:PORT
#                SAFEACK_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
#                SAFEACK_KAFKA_SASL_USER=admin SAFEACK_KAFKA_SASL_PASSWORD=...
#                SAFEACK_KAFKA_CA=DATA_DIR/tls/ca.pem
#                SAFEACK_KAFKA_TLS_SERVER_NAME=localhost
#              (internal/kafkatest reads them all). Already running -> prints
#              the same line, exit 0 (a broker of another version or
#              security there -> error, exit 1).
#              On failure: last 50 broker log lines on stderr, exit 1.
#   stop       SIGTERM, SIGKILL after $SAFEACK_KAFKA_STOP_TIMEOUT s, then remove
#              the data dir. Idempotent (exit 0 when nothing runs).
#   status     exit 0 when the broker runs and its port accepts connections,
#              3 when it does not run, 1 when the process lives but the port is dead.
#   fetch      only resolve the jars into the cache (e.g. a CI cache warm-up).
#   classpath  print the classpath (resolving first if needed).
#   logs       print the last 50 (or $SAFEACK_KAFKA_LOG_LINES) lines of the broker log.
#   run CLASS  run a Kafka tool class on the cached classpath, e.g.
#              scripts/kafka.sh run org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:29092 --list
#              (a secured broker: add --command-config DATA_DIR/client.properties,
#              the admin's client settings, which start writes)
#
# Environment (all optional):
#   SAFEACK_KAFKA_VERSION          Kafka version to run                (4.1.2)
#                                  (internal/kafkatest reads it too: the
#                                  Sarama Version of the tests)
#   SAFEACK_KAFKA_PORT             PLAINTEXT port                      (29092)
#   SAFEACK_KAFKA_CONTROLLER_PORT  CONTROLLER port                     (PORT+1)
#   SAFEACK_KAFKA_CACHE            jar cache    (~/.cache/safeack/kafka-VERSION)
#   SAFEACK_KAFKA_DATA_DIR         data dir: config, pid, log, log.dirs
#                                  (${TMPDIR:-/tmp}/safeack-kafka-PORT)
#   SAFEACK_KAFKA_HEAP             JVM max heap                        (512m)
#   SAFEACK_KAFKA_JAVA             java binary (else $JAVA_HOME/bin/java, else java); needs 17+
#   SAFEACK_KAFKA_START_TIMEOUT    seconds to wait for the broker      (90)
#   SAFEACK_KAFKA_STOP_TIMEOUT     seconds between SIGTERM and SIGKILL (30)
#   SAFEACK_KAFKA_JVM_OPTS         extra broker JVM flags, space-separated
#   SAFEACK_KAFKA_EXTRA_PROPS      extra server.properties lines, newline-separated
#   SAFEACK_KAFKA_SHARE_PROBE_TIMEOUT  seconds start waits, on 4.2+, for a
#                                  share group to consume a probe record (120)
#   SAFEACK_KAFKA_LOG_LEVELS       broker loggers to set, space-separated
#                                  LOGGER=LEVEL words, e.g.
#                                  org.apache.kafka.server.share.persister=DEBUG
#   SAFEACK_KAFKA_MVN              maven binary                        (mvn)
#   SAFEACK_KAFKA_SECURITY         plaintext or sasl_ssl               (plaintext)
#                                  sasl_ssl: the client listener on PORT is
#                                  SASL_SSL only: SCRAM-SHA-512 logins, the
#                                  broker's certificate (for localhost and
#                                  127.0.0.1) signed by a CA made at start
#                                  (openssl; DATA_DIR/tls/ca.pem, its key
#                                  deleted once it signed); the standard
#                                  authorizer with allow.everyone.if.no.acl.found=
#                                  false; one super user, admin, with a random
#                                  password, its SCRAM credentials written at
#                                  format time (--add-scram). The broker's own
#                                  connections log in as admin; the controller
#                                  listener takes SASL/PLAIN for admin alone
#                                  (KRaft's controllers cannot check SCRAM).
#                                  Single broker only.
#
# What differs between versions is kept in one place (version_settings and
# write_node_config below, shared with scripts/kafka-cluster.sh): 3.x logs
# through reload4j (log4j.properties) and has BrokerApiVersionsCommand in
# kafka.admin; 4.x logs through Log4j 2; share-group settings from 4.0 (the
# share coordinator's topic) and 4.2 (short share-group minimums).
set -euo pipefail

KAFKA_VERSION=$(printf '%s' "${SAFEACK_KAFKA_VERSION:-4.1.2}" | tr -d '[:space:]')
SECURITY=$(printf '%s' "${SAFEACK_KAFKA_SECURITY:-plaintext}" | tr -d '[:space:]' | tr '[:upper:]' '[:lower:]')
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
POM="$SCRIPT_DIR/kafka/pom.xml"

HOST=127.0.0.1
# Below Linux's ephemeral range (32768-60999 by default): while the broker
# is down for a restart, a client retrying 127.0.0.1:PORT from an ephemeral
# port can connect to itself (TCP simultaneous open) and hold PORT, and the
# restarted broker then fails to bind it.
PORT=${SAFEACK_KAFKA_PORT:-29092}
CONTROLLER_PORT=${SAFEACK_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}
CACHE=${SAFEACK_KAFKA_CACHE:-${HOME:-/root}/.cache/safeack/kafka-$KAFKA_VERSION}
LIBS="$CACHE/libs"
DATA_DIR=${SAFEACK_KAFKA_DATA_DIR:-${TMPDIR:-/tmp}/safeack-kafka-$PORT}
HEAP=${SAFEACK_KAFKA_HEAP:-512m}
START_TIMEOUT=${SAFEACK_KAFKA_START_TIMEOUT:-90}
STOP_TIMEOUT=${SAFEACK_KAFKA_STOP_TIMEOUT:-30}
MVN=${SAFEACK_KAFKA_MVN:-mvn}

PID_FILE="$DATA_DIR/kafka.pid"
LOG_FILE="$DATA_DIR/kafka.log"
CONFIG="$DATA_DIR/server.properties"
MARKER="$DATA_DIR/.safeack-kafka"
# Put on the broker's command line so that we only ever signal our own JVM
# (guards against a stale pid file whose pid got reused).
TAG="-Dsafeack.kafka.datadir=$DATA_DIR"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ------------------------------------------------------------- version -------

# version_settings parses KAFKA_VERSION and sets what depends on it:
#   KAFKA_MAJOR, KAFKA_MINOR  numbers
#   LOGGING                   log4j2 (4.x) or reload4j (3.x, Log4j 1.2 API)
#   API_VERSIONS_CLASS        the BrokerApiVersionsCommand class (moved to
#                             kafka-tools in 4.0)
# Only 3.9.x and 4.x: KRaft without ZooKeeper is production-ready from 3.3,
# but 3.9 is the last 3.x line and the only one this config is tested on.
# shellcheck disable=SC2034 # API_VERSIONS_CLASS: for scripts/kafka-cluster.sh
version_settings() {
  [[ "$KAFKA_VERSION" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] ||
    die "SAFEACK_KAFKA_VERSION='$KAFKA_VERSION' is not a release version like 4.1.2"
  KAFKA_MAJOR=$((10#${BASH_REMATCH[1]}))
  KAFKA_MINOR=$((10#${BASH_REMATCH[2]}))
  if ((KAFKA_MAJOR == 4)); then
    LOGGING=log4j2
    API_VERSIONS_CLASS=org.apache.kafka.tools.BrokerApiVersionsCommand
  elif ((KAFKA_MAJOR == 3 && KAFKA_MINOR == 9)); then
    LOGGING=reload4j
    API_VERSIONS_CLASS=kafka.admin.BrokerApiVersionsCommand
  else
    die "Kafka $KAFKA_VERSION is not supported by these scripts: use 3.9.x (the last 3.x line) or 4.x (SAFEACK_KAFKA_VERSION)"
  fi
}

# version_at_least MAJOR MINOR: KAFKA_VERSION is MAJOR.MINOR.x or later.
version_at_least() {
  ((KAFKA_MAJOR > $1 || (KAFKA_MAJOR == $1 && KAFKA_MINOR >= $2)))
}

version_settings

case "$SECURITY" in
  plaintext | sasl_ssl) ;;
  *) die "SAFEACK_KAFKA_SECURITY='$SECURITY': use plaintext (the default) or sasl_ssl" ;;
esac

# ---------------------------------------------------------------- java -------

java_bin() {
  if [[ -n "${SAFEACK_KAFKA_JAVA:-}" ]]; then
    printf '%s\n' "$SAFEACK_KAFKA_JAVA"
  elif [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
    printf '%s\n' "$JAVA_HOME/bin/java"
  elif command -v java >/dev/null 2>&1; then
    command -v java
  else
    die "no java found: install a JDK 17+ or set SAFEACK_KAFKA_JAVA / JAVA_HOME"
  fi
}

check_java() {
  JAVA=$(java_bin)
  local v major
  v=$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1) ||
    true
  [[ -n "$v" ]] || die "cannot run '$JAVA -version'"
  major=${v%%.*}
  [[ "$major" == 1 ]] && major=$(cut -d. -f2 <<<"$v")
  [[ "$major" =~ ^[0-9]+$ ]] || die "cannot parse java version '$v' of $JAVA"
  ((major >= 17)) || die "Kafka $KAFKA_VERSION needs Java 17+, but $JAVA is $v (set SAFEACK_KAFKA_JAVA or JAVA_HOME)"
}

# ---------------------------------------------------------------- jars -------

# RESOLVER names how resolve_jars fills the cache: a cache made another way
# (or from another pom) is resolved again.
RESOLVER=2

pom_stamp() {
  { printf '%s\n' "$KAFKA_VERSION" "$RESOLVER"; cat "$POM"; } | cksum | cut -d' ' -f1
}

# has_slf4j_binding DIR: DIR holds the SLF4J binding of this version's
# logging (without it the broker logs nothing, and start waits in vain).
has_slf4j_binding() {
  local pattern=log4j-slf4j-impl-
  [[ "$LOGGING" == reload4j ]] && pattern=slf4j-reload4j-
  compgen -G "$1/$pattern*.jar" >/dev/null
}

cache_complete() {
  [[ -f "$CACHE/.complete" && -f "$CACHE/libs.list" && -d "$LIBS" ]] || return 1
  [[ "$(cat "$CACHE/.complete")" == "$(pom_stamp)" ]] || return 1
  # every jar Maven copied must still be there
  local jar
  while IFS= read -r jar; do
    [[ -f "$LIBS/$jar" ]] || return 1
  done <"$CACHE/libs.list"
  [[ -f "$LIBS/kafka_2.13-$KAFKA_VERSION.jar" && -f "$LIBS/kafka-tools-$KAFKA_VERSION.jar" ]] &&
    has_slf4j_binding "$LIBS"
}

resolve_jars() {
  cache_complete && return 0
  mkdir -p "$CACHE"
  (
    # serialise concurrent resolutions (parallel CI jobs sharing a cache)
    if command -v flock >/dev/null 2>&1; then
      exec 9>"$CACHE/.lock"
      flock -w 600 9 || die "timed out waiting for lock $CACHE/.lock"
    fi
    cache_complete && exit 0
    command -v "$MVN" >/dev/null 2>&1 ||
      die "maven ('$MVN') not found: it is needed once to fetch the Kafka jars into $CACHE"
    log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $LIBS ..."
    local tmp="$CACHE/libs.tmp.$$" mvnlog="$CACHE/mvn.log" t0=$SECONDS
    rm -rf "$tmp" "$tmp.build"
    local mvnargs=(-B -q -f "$POM" "-Dkafka.version=$KAFKA_VERSION"
      "-Dsafeack.kafka.line=$KAFKA_MAJOR" "-Dsafeack.kafka.libs=$tmp")
    if ! "$MVN" "${mvnargs[@]}" dependency:copy-dependencies >"$mvnlog" 2>&1; then
      tail -n 50 "$mvnlog" >&2 || true
      rm -rf "$tmp" "$tmp.build"
      die "maven failed to resolve the Kafka $KAFKA_VERSION jars (is $KAFKA_VERSION on Maven Central? full log: $mvnlog)"
    fi
    [[ -f "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] ||
      die "maven succeeded but $tmp/kafka_2.13-$KAFKA_VERSION.jar is missing"
    if [[ "$LOGGING" == log4j2 ]]; then
      # The Log4j 2 binding of the log4j-core this Kafka brought (see the pom).
      local core l4j
      core=$(cd "$tmp" && compgen -G 'log4j-core-*.jar' | head -n1) ||
        die "Kafka $KAFKA_VERSION brought no log4j-core (see $tmp)"
      l4j=${core#log4j-core-}
      l4j=${l4j%.jar}
      if ! "$MVN" "${mvnargs[@]}" dependency:copy \
          "-Dartifact=org.apache.logging.log4j:log4j-slf4j-impl:$l4j" \
          "-DoutputDirectory=$tmp" >>"$mvnlog" 2>&1; then
        tail -n 50 "$mvnlog" >&2 || true
        rm -rf "$tmp" "$tmp.build"
        die "maven failed to fetch log4j-slf4j-impl $l4j (full log: $mvnlog)"
      fi
    fi
    rm -rf "$tmp.build"
    has_slf4j_binding "$tmp" ||
      die "no SLF4J binding for $LOGGING among the resolved jars in $tmp"
    rm -rf "$LIBS" "$CACHE/.complete"
    mv "$tmp" "$LIBS"
    (cd "$LIBS" && ls -1 -- *.jar) >"$CACHE/libs.list"
    pom_stamp >"$CACHE/.complete"
    log "resolved $(find "$LIBS" -name '*.jar' | wc -l) jars in $((SECONDS - t0)) s"
  )
}

classpath() { printf '%s\n' "$LIBS/*"; }

# ------------------------------------------------------------- process -------

tcp_open() { # host port -> 0 when something accepts connections
  # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# pid of our broker, or nothing
broker_pid() {
  local pid=""
  if [[ -f "$PID_FILE" ]]; then
    pid=$(tr -dc '0-9' <"$PID_FILE" || true)
    if [[ -n "$pid" ]] && is_ours "$pid"; then
      printf '%s\n' "$pid"
      return 0
    fi
  fi
  # pid file lost: look for a JVM carrying our exact tag
  local d
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    is_ours "$pid" && { printf '%s\n' "$pid"; return 0; }
  done
  return 0
}

is_ours() {
  local pid=$1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  # arguments are NUL-separated; compare whole arguments
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -Fxq -- "$TAG"
}

# alive: the process runs (or is stopped by SIGSTOP). A zombie (exited, not
# yet reaped) is not alive: a broker launched detached is re-parented to
# PID 1, which in some containers reaps only every few seconds, so kill -0
# alone would see a killed broker live on.
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [[ "$(proc_state "$1")" != Z ]]
}

# proc_state PID: the state letter of /proc/PID/stat (R, S, T, Z, ...), or
# nothing when there is no such process. The command name, in parentheses,
# may hold spaces: read after the last ')'.
proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  printf '%s\n' "${stat%% *}"
}

tail_log() {
  local n=${1:-50}
  if [[ -f "$LOG_FILE" ]]; then
    log "----- last $n lines of $LOG_FILE -----"
    tail -n "$n" "$LOG_FILE" >&2 || true
    log "----- end of broker log -----"
  else
    log "(no broker log at $LOG_FILE)"
  fi
}

kill_broker() { # pid
  local pid=$1 deadline
  alive "$pid" || return 0
  log "stopping broker (pid $pid) ..."
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
  if alive "$pid"; then
    log "broker did not stop within ${STOP_TIMEOUT}s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
  fi
  alive "$pid" && die "could not kill broker pid $pid"
  return 0
}

# launch_detached runs the broker command given as arguments in the
# background. setsid + nohup: the broker outlives this script and its
# terminal / process group; all its fds point at the log so it never holds a
# caller's pipe open (not from a subshell either: a backgrounded command in
# ( ... & ) keeps the caller's stdout open). The inner shell records its own
# pid in the pid file, then execs the command (same pid).
launch_detached() { # command...
  # shellcheck disable=SC2016 # expanded by the inner bash
  local launcher=(bash -c 'echo $$ >"$1"; shift; exec "$@"' safeack-kafka "$PID_FILE" "$@")
  if command -v setsid >/dev/null 2>&1; then
    nohup setsid "${launcher[@]}" </dev/null >>"$LOG_FILE" 2>&1 &
  else
    nohup "${launcher[@]}" </dev/null >>"$LOG_FILE" 2>&1 &
  fi
}

remove_data_dir() {
  [[ -e "$DATA_DIR" ]] || return 0
  # never rm -rf a directory we did not create
  if [[ -f "$MARKER" ]]; then
    rm -rf -- "$DATA_DIR"
  else
    die "$DATA_DIR exists but was not created by kafka.sh (no $MARKER); not removing it"
  fi
}

# ---------------------------------------------------------------- config -----

random_cluster_id() {
  # Kafka's Uuid: 16 random bytes, URL-safe base64 without padding (22 chars).
  # Like Uuid.randomUuid(), avoid a leading '-' (it would parse as an option).
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [[ ${#id} == 22 && "$id" != -* && "$id" != AAAAAAAAAAAAAAAAAAAAA[AB] ]] && break
  done
  printf '%s\n' "$id"
}

# write_node_config NODE_ID BROKER_PORT CONTROLLER_PORT VOTERS NODES [EXTRA]
# writes $CONFIG (and the log configs, into $DATA_DIR) for one combined
# broker+controller node of an NODES-node KRaft cluster: the one generator
# for scripts/kafka.sh's single broker (NODES 1) and scripts/kafka-cluster.sh's
# nodes. VOTERS is controller.quorum.voters (ID@HOST:PORT,...; a static
# quorum, which 3.9 and 4.x both take). EXTRA: lines appended as they are.
write_node_config() {
  local id=$1 port=$2 cport=$3 voters=$4 nodes=$5 extra=${6:-}
  [[ "$SECURITY" == plaintext ]] || ((nodes == 1)) ||
    die "SAFEACK_KAFKA_SECURITY=$SECURITY is for scripts/kafka.sh's single broker; the cluster runs plaintext"
  local rf=1 isr=1 parts=1 txparts=1
  if ((nodes > 1)); then
    rf=$((nodes < 3 ? nodes : 3)) isr=2 parts=12 txparts=4
    ((rf >= 2)) || isr=1
  fi
  mkdir -p "$DATA_DIR/data"
  {
    cat <<EOF
# generated by scripts/kafka.sh -- Kafka $KAFKA_VERSION, node $id of a $nodes-node KRaft test cluster
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
$(listener_config "$port" "$cport")
log.dirs=$DATA_DIR/data

num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
unclean.leader.election.enable=false
auto.create.topics.enable=true
delete.topic.enable=true

offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=$parts
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=$txparts

# fast group joins; allow short session timeouts so tests that kill members are quick
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=500
EOF
    if version_at_least 4 0; then
      cat <<EOF

# share groups' state topic (KIP-932; 4.0 on)
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
share.coordinator.state.topic.num.partitions=$txparts
EOF
    fi
    if version_at_least 4 2; then
      # Share groups are on in 4.2+ through the share.version feature, which
      # a storage formatted at the release's own metadata version finalizes
      # (cmd_start checks it). The broker decides a share group's session,
      # heartbeat and record lock times; lower their minimums so a test can
      # shorten them per group (share.session.timeout.ms, ... group configs).
      cat <<EOF

# share groups: Kafka's defaults, but tests may set shorter group configs
group.share.min.session.timeout.ms=1000
group.share.min.heartbeat.interval.ms=500
group.share.min.record.lock.duration.ms=1000
EOF
    fi
    if ((nodes > 1)); then
      cat <<EOF

# A dead or hung node is fenced (its partitions led elsewhere, it leaves
# every ISR) 6 s after its last heartbeat to the controller, not 9 s: quick
# failover, still safe from a loaded machine's pauses.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
EOF
    fi
    cat <<EOF

# small machine (2 cores, up to three JVMs)
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
log.segment.bytes=67108864
EOF
    if [[ -n "$extra" ]]; then
      printf '\n# extra properties (SAFEACK_KAFKA_EXTRA_PROPS / SAFEACK_CLUSTER_EXTRA_PROPS)\n%s\n' "$extra"
    fi
  } >"$CONFIG"
  write_log_configs
  printf '%s\n' "$KAFKA_VERSION" >"$DATA_DIR/version"
}

# listener_config PORT CPORT prints the listener lines of server.properties:
# PLAINTEXT on PORT, or (SECURITY sasl_ssl) SASL_SSL with SCRAM-SHA-512, TLS
# from $DATA_DIR/tls (make_tls), the standard authorizer and admin as the
# only super user ($ADMIN_PASSWORD, set by make_tls). The controller
# listener is plaintext, or SASL_PLAINTEXT with PLAIN for admin alone.
listener_config() {
  local port=$1 cport=$2
  if [[ "$SECURITY" == plaintext ]]; then
    cat <<EOF
listeners=PLAINTEXT://$HOST:$port,CONTROLLER://$HOST:$cport
advertised.listeners=PLAINTEXT://$HOST:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
EOF
    return
  fi
  local tls="$DATA_DIR/tls" pw=$ADMIN_PASSWORD
  cat <<EOF
listeners=SASL_SSL://$HOST:$port,CONTROLLER://$HOST:$cport
advertised.listeners=SASL_SSL://$HOST:$port
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL

# SAFEACK_KAFKA_SECURITY=sasl_ssl: SCRAM-SHA-512 over TLS for clients and the
# broker's own connections (as admin); PLAIN on the controller listener
# (KRaft's controllers cannot check SCRAM: the credentials live in the
# metadata they serve); admin the only super user; nothing allowed without
# an ACL.
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$pw";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$pw" user_admin="$pw";
ssl.keystore.type=PKCS12
ssl.keystore.location=$tls/broker.p12
ssl.keystore.password=$pw
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.pem
ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
EOF
}

# make_tls (SECURITY sasl_ssl) writes into $DATA_DIR/tls a CA made for this
# run (ca.pem; its key is deleted once it signed) and the broker's key and
# certificate, for DNS localhost and IP 127.0.0.1, signed by that CA, in a
# PKCS12 keystore (broker.p12); sets ADMIN_PASSWORD (random, 36 hex
# digits) and writes the admin's client settings for Kafka's tools
# ($DATA_DIR/client.properties, mode 600). Both keys are EC P-256: a
# test run opens hundreds of connections, and the broker's handshakes
# cost less CPU than with RSA 2048.
make_tls() {
  [[ "$SECURITY" == sasl_ssl ]] || return 0
  command -v openssl >/dev/null 2>&1 ||
    die "SAFEACK_KAFKA_SECURITY=sasl_ssl needs openssl to make the CA and the broker's certificate"
  [[ "$DATA_DIR" =~ ^[A-Za-z0-9_./+-]+$ ]] ||
    die "data dir '$DATA_DIR' has characters other than letters, digits and _./+-; set SAFEACK_KAFKA_DATA_DIR"
  local tls="$DATA_DIR/tls"
  mkdir -p "$tls"
  chmod 700 "$tls"
  ADMIN_PASSWORD=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
  if ! (
    set -e
    cd "$tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem -days 7 \
      -subj "/CN=safeack test CA $(date +%s)" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout broker.key -out broker.csr -subj "/CN=localhost"
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=CA:FALSE" \
      "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out broker.pem \
      -days 7 -extfile broker.ext
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
      -out broker.p12 -passout "pass:$ADMIN_PASSWORD"
    rm -f ca.key ca.srl broker.key broker.csr broker.ext
  ) >"$tls/openssl.log" 2>&1; then
    cat "$tls/openssl.log" >&2
    die "openssl failed to make the test CA and the broker's certificate"
  fi
  (
    umask 077
    cat >"$DATA_DIR/client.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$ADMIN_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.pem
EOF
  )
}

# client_env prints the line start prints: the bootstrap address and, for a
# secured broker, what a client needs to log in (see the header).
client_env() {
  if [[ "$SECURITY" == plaintext ]]; then
    printf 'SAFEACK_KAFKA_BROKERS=%s:%s\n' "$HOST" "$PORT"
    return
  fi
  local pw
  pw=$(sed -n 's/.*username="admin" password="\([^"]*\)".*/\1/p' "$DATA_DIR/client.properties" 2>/dev/null | head -n1)
  [[ -n "$pw" ]] || die "no admin password in $DATA_DIR/client.properties"
  printf 'SAFEACK_KAFKA_BROKERS=%s:%s SAFEACK_KAFKA_SASL_MECHANISM=SCRAM-SHA-512 SAFEACK_KAFKA_SASL_USER=admin SAFEACK_KAFKA_SASL_PASSWORD=%s SAFEACK_KAFKA_CA=%s SAFEACK_KAFKA_TLS_SERVER_NAME=localhost\n' \
    "$HOST" "$PORT" "$pw" "$DATA_DIR/tls/ca.pem"
}

# tool_login FLAG: the tool flag (its name for a client config file:
# --config, --command-config) and file that log Kafka's tools in as admin
# on a secured broker, one a line; nothing for a plaintext one.
tool_login() {
  [[ "$SECURITY" == plaintext ]] || printf '%s\n' "$1" "$DATA_DIR/client.properties"
}

# check_running_security: dies when the broker already running was started
# with another SAFEACK_KAFKA_SECURITY than this one.
check_running_security() {
  local running=plaintext
  [[ -f "$DATA_DIR/security" ]] && running=$(tr -d '[:space:]' <"$DATA_DIR/security")
  [[ "$running" == "$SECURITY" ]] ||
    die "the broker running for $DATA_DIR was started with SAFEACK_KAFKA_SECURITY=$running, not $SECURITY: stop it first ('$0 stop') or pick another SAFEACK_KAFKA_PORT"
}

# write_log_configs writes the broker's and the tool JVMs' logging configs
# into $DATA_DIR: Log4j 2 properties for 4.x, Log4j 1.2 (reload4j) for 3.x.
# Broker: INFO to stdout (the log file), state changes and the cleaner at
# WARN; tools: WARN to stderr.
write_log_configs() {
  if [[ "$LOGGING" == reload4j ]]; then
    cat >"$DATA_DIR/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
EOF
    extra_log_levels >>"$DATA_DIR/log4j.properties"
    cat >"$DATA_DIR/tools-log4j.properties" <<'EOF'
log4j.rootLogger=WARN, err
log4j.appender.err=org.apache.log4j.ConsoleAppender
log4j.appender.err.Target=System.err
log4j.appender.err.layout=org.apache.log4j.PatternLayout
log4j.appender.err.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
    return
  fi
  cat >"$DATA_DIR/log4j2.properties" <<'EOF'
status = warn
name = safeack-kafka-broker
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
EOF
  extra_log_levels >>"$DATA_DIR/log4j2.properties"
  cat >"$DATA_DIR/tools-log4j2.properties" <<'EOF'
status = warn
name = safeack-kafka-tools
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
EOF
}

# extra_log_levels prints the broker logger settings SAFEACK_KAFKA_LOG_LEVELS
# asks for (LOGGER=LEVEL words), in the syntax of this version's logging.
extra_log_levels() {
  local words w name level i=0
  read -r -a words <<<"${SAFEACK_KAFKA_LOG_LEVELS:-}"
  for w in "${words[@]}"; do
    [[ "$w" =~ ^([A-Za-z0-9_.$-]+)=([A-Za-z]+)$ ]] ||
      die "SAFEACK_KAFKA_LOG_LEVELS: '$w' is not LOGGER=LEVEL"
    name=${BASH_REMATCH[1]} level=${BASH_REMATCH[2]}
    if [[ "$LOGGING" == reload4j ]]; then
      printf 'log4j.logger.%s=%s\n' "$name" "$level"
    else
      i=$((i + 1))
      printf 'logger.extra%d.name = %s\nlogger.extra%d.level = %s\n' "$i" "$name" "$i" "$level"
    fi
  done
}

# log_config_flag KIND: the JVM flag that points Log4j at $DATA_DIR's
# config, KIND broker or tools; nothing when the file is not there.
log_config_flag() {
  local prefix=""
  [[ "$1" == tools ]] && prefix=tools-
  if [[ "$LOGGING" == reload4j ]]; then
    [[ -f "$DATA_DIR/${prefix}log4j.properties" ]] &&
      printf '%s\n' "-Dlog4j.configuration=file:$DATA_DIR/${prefix}log4j.properties"
  else
    [[ -f "$DATA_DIR/${prefix}log4j2.properties" ]] &&
      printf '%s\n' "-Dlog4j2.configurationFile=$DATA_DIR/${prefix}log4j2.properties"
  fi
  return 0
}

# broker_argv sets BROKER_ARGV to the command line of the current node's
# broker JVM ($DATA_DIR, $CONFIG, $TAG): the same for the single broker and
# every cluster node.
broker_argv() {
  BROKER_ARGV=(
    "$JAVA" "-Xmx$HEAP"
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError
    -Djava.awt.headless=true
    "-Dkafka.logs.dir=$DATA_DIR"
    "$TAG"
  )
  if [[ -n "${SAFEACK_KAFKA_JVM_OPTS:-}" ]]; then
    local extra
    read -r -a extra <<<"$SAFEACK_KAFKA_JVM_OPTS"
    BROKER_ARGV+=("${extra[@]}")
  fi
  local l4j
  l4j=$(log_config_flag broker)
  BROKER_ARGV+=(${l4j:+"$l4j"} -cp "$(classpath)" kafka.Kafka "$CONFIG")
}

# JVM flags for short-lived tool JVMs (format, readiness check)
tool_jvm_opts() {
  local l4j
  l4j=$(log_config_flag tools)
  printf '%s\n' -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Djava.awt.headless=true ${l4j:+"$l4j"}
}

run_tool() { # class args...
  local opts
  mapfile -t opts < <(tool_jvm_opts)
  "$JAVA" "${opts[@]}" -cp "$(classpath)" "$@"
}

run_tool_timeout() { # seconds class args...
  local secs=$1 opts
  shift
  mapfile -t opts < <(tool_jvm_opts)
  timeout -k 5 "$secs" "$JAVA" "${opts[@]}" -cp "$(classpath)" "$@"
}

# ---------------------------------------------------------------- commands ---

cmd_start() {
  check_java
  local pid
  pid=$(broker_pid)
  if [[ -n "$pid" ]]; then
    check_running_version "$DATA_DIR/version"
    check_running_security
    if tcp_open "$HOST" "$PORT"; then
      log "broker already running (Kafka $KAFKA_VERSION, $SECURITY, pid $pid, data dir $DATA_DIR)"
      client_env
      return 0
    fi
    die "a broker (pid $pid) runs for $DATA_DIR but $HOST:$PORT does not answer; run '$0 stop' first"
  fi

  local p
  for p in "$PORT" "$CONTROLLER_PORT"; do
    tcp_open "$HOST" "$p" &&
      die "port $HOST:$p is already in use by another process (set SAFEACK_KAFKA_PORT / SAFEACK_KAFKA_CONTROLLER_PORT)"
  done

  resolve_jars

  remove_data_dir
  mkdir -p "$DATA_DIR/data"
  : >"$MARKER"
  printf '%s\n' "$SECURITY" >"$DATA_DIR/security"
  make_tls
  write_node_config 1 "$PORT" "$CONTROLLER_PORT" "1@$HOST:$CONTROLLER_PORT" 1 "${SAFEACK_KAFKA_EXTRA_PROPS:-}"
  local cluster_id
  cluster_id=$(random_cluster_id)
  printf '%s\n' "$cluster_id" >"$DATA_DIR/cluster.id"

  local t0=$SECONDS
  log "formatting storage in $DATA_DIR/data (cluster id $cluster_id) ..."
  local scram=()
  [[ "$SECURITY" == plaintext ]] || scram=(--add-scram "SCRAM-SHA-512=[name=admin,password=$ADMIN_PASSWORD]")
  if ! run_tool kafka.tools.StorageTool format --cluster-id "$cluster_id" \
      --config "$CONFIG" --ignore-formatted "${scram[@]}" >"$DATA_DIR/format.log" 2>&1; then
    cat "$DATA_DIR/format.log" >&2 || true
    die "kafka-storage format failed"
  fi

  log "starting Kafka $KAFKA_VERSION ($SECURITY) on $HOST:$PORT (controller $HOST:$CONTROLLER_PORT, heap $HEAP) ..."
  broker_argv
  launch_detached "${BROKER_ARGV[@]}"

  local deadline=$((SECONDS + START_TIMEOUT)) started="" answered=""
  pid=""
  while ((SECONDS < deadline)); do
    [[ -z "$pid" && -s "$PID_FILE" ]] && pid=$(tr -dc '0-9' <"$PID_FILE")
    if [[ -n "$pid" ]] && ! alive "$pid"; then
      tail_log 50
      die "broker process $pid exited during startup (log: $LOG_FILE)"
    fi
    if [[ -z "$started" ]] && grep -q 'Kafka Server started' "$LOG_FILE" 2>/dev/null; then
      started=1
    fi
    if [[ -n "$started" ]] && tcp_open "$HOST" "$PORT"; then
      # a real request: ask the broker for its cluster id and compare
      local out login
      mapfile -t login < <(tool_login --config)
      if out=$(run_tool_timeout 30 org.apache.kafka.tools.ClusterTool cluster-id \
          --bootstrap-server "$HOST:$PORT" "${login[@]}" 2>"$DATA_DIR/check.log") &&
        grep -qF "$cluster_id" <<<"$out"; then
        answered=1
        break
      fi
    fi
    sleep 0.5
  done

  if [[ -z "$answered" ]]; then
    tail_log 50
    [[ -s "$DATA_DIR/check.log" ]] && { log "readiness check output:"; tail -n 20 "$DATA_DIR/check.log" >&2; }
    pid=$(broker_pid)
    [[ -z "$pid" ]] || kill_broker "$pid"
    if [[ -z "$started" ]]; then
      die "broker did not log 'Kafka Server started' within ${START_TIMEOUT}s (data dir kept: $DATA_DIR)"
    fi
    die "broker started but did not answer on $HOST:$PORT within ${START_TIMEOUT}s (data dir kept: $DATA_DIR)"
  fi

  if ! check_share_groups "$HOST:$PORT"; then
    tail_log 20
    kill_broker "$pid"
    die "Kafka $KAFKA_VERSION started without share groups (data dir kept: $DATA_DIR)"
  fi
  if ! wait_share_ready "$HOST:$PORT"; then
    tail_log 20
    kill_broker "$pid"
    die "Kafka $KAFKA_VERSION: no share group could consume a record (data dir kept: $DATA_DIR)"
  fi

  log "Kafka $KAFKA_VERSION ($SECURITY) ready in $((SECONDS - t0)) s (pid $pid, log $LOG_FILE)"
  client_env
}

# check_running_version FILE: dies when the broker or cluster already
# running was started as another Kafka version than KAFKA_VERSION (FILE is
# the version its start wrote), rather than hand its address out as this one.
check_running_version() {
  local running=""
  [[ -f "$1" ]] && running=$(tr -d '[:space:]' <"$1")
  [[ -z "$running" || "$running" == "$KAFKA_VERSION" ]] ||
    die "Kafka $running already runs for $(dirname -- "$1"), not $KAFKA_VERSION: stop it first ('$0 stop') or pick other ports (SAFEACK_KAFKA_PORT / SAFEACK_CLUSTER_PORT)"
}

# check_share_groups BOOTSTRAP: on 4.2+, where share groups are generally
# available, succeeds only when the cluster finalized share.version >= 1 (the
# feature that turns them on); earlier versions need nothing.
check_share_groups() {
  version_at_least 4 2 || return 0
  local out level login
  mapfile -t login < <(tool_login --command-config)
  if ! out=$(run_tool_timeout 30 org.apache.kafka.tools.FeatureCommand \
      --bootstrap-server "$1" "${login[@]}" describe 2>>"$DATA_DIR/check.log"); then
    log "kafka-features describe failed (see $DATA_DIR/check.log)"
    return 1
  fi
  level=$(sed -n 's/.*Feature: share\.version[[:space:]].*FinalizedVersionLevel: \([0-9]*\).*/\1/p' <<<"$out" | head -n1)
  if [[ -z "$level" || "$level" -lt 1 ]]; then
    log "share.version is not finalized at 1 or more: kafka-features describe says:"
    printf '%s\n' "$out" >&2
    return 1
  fi
  log "share groups on (share.version $level)"
}

# wait_share_ready BOOTSTRAP: on 4.2+, waits until a share group consumes a
# record end to end (a throwaway group, safeack-share-probe, on a topic of
# the same name, through Kafka's own console tools). The first share group
# a broker serves makes it create and load its share-state topic
# (__share_group_state); until that is done the group coordinator's
# attempts to initialize the group's share-partition state fail
# (COORDINATOR_NOT_AVAILABLE, then COORDINATOR_LOAD_IN_PROGRESS) and are
# retried with exponential backoff (1, 2, 4, 8, 16 s), while the group's
# members get no partitions. Measured here: 1.6-7 s on a loaded 2-core
# machine; tests must not absorb it (docs/testing.md).
# SAFEACK_KAFKA_SHARE_PROBE_TIMEOUT bounds the wait (s, default 120).
wait_share_ready() {
  version_at_least 4 2 || return 0
  local b=$1 t0=$SECONDS name=safeack-share-probe out login
  local secs=${SAFEACK_KAFKA_SHARE_PROBE_TIMEOUT:-120}
  mapfile -t login < <(tool_login --command-config)
  # The group starts at the log start (the probe record is produced before
  # it joins) and heartbeats every 0.5 s (the broker's minimum here); its
  # configs and the record are set up at once (two tool JVMs).
  run_tool_timeout 60 org.apache.kafka.tools.ConfigCommand --bootstrap-server "$b" "${login[@]}" \
    --alter --entity-type groups --entity-name "$name" \
    --add-config share.auto.offset.reset=earliest,share.heartbeat.interval.ms=500 >"$DATA_DIR/probe-config.log" 2>&1 &
  local config=$!
  if ! printf 'share probe\n' | run_tool_timeout 60 org.apache.kafka.tools.ConsoleProducer \
      --bootstrap-server "$b" "${login[@]}" --topic "$name" >"$DATA_DIR/probe-produce.log" 2>&1; then
    wait "$config" || true
    log "share probe: producing the probe record failed (see $DATA_DIR/probe-produce.log)"
    return 1
  fi
  if ! wait "$config"; then
    log "share probe: setting the probe group's configs failed (see $DATA_DIR/probe-config.log)"
    return 1
  fi
  out=$(run_tool_timeout $((secs + 30)) org.apache.kafka.tools.consumer.ConsoleShareConsumer \
    --bootstrap-server "$b" "${login[@]}" --topic "$name" --group "$name" \
    --max-messages 1 --timeout-ms $((secs * 1000)) 2>"$DATA_DIR/probe-consume.log") || true
  if [[ "$out" != *"share probe"* ]]; then
    log "share probe: the share group consumed nothing within ${secs}s (see $DATA_DIR/probe-consume.log)"
    return 1
  fi
  log "share groups ready: a share group consumed a record $((SECONDS - t0)) s after the probe began"
}

cmd_stop() {
  local pid
  pid=$(broker_pid)
  if [[ -n "$pid" ]]; then
    kill_broker "$pid"
  else
    log "broker not running"
  fi
  remove_data_dir
  return 0
}

cmd_status() {
  local pid
  pid=$(broker_pid)
  if [[ -z "$pid" ]]; then
    log "not running"
    return 3
  fi
  if tcp_open "$HOST" "$PORT"; then
    log "running (Kafka $(cat "$DATA_DIR/version" 2>/dev/null || echo '?'), $(cat "$DATA_DIR/security" 2>/dev/null || echo plaintext), pid $pid) on $HOST:$PORT, data dir $DATA_DIR"
    SECURITY=$(cat "$DATA_DIR/security" 2>/dev/null || echo plaintext) client_env
    return 0
  fi
  log "process $pid is alive but $HOST:$PORT does not accept connections"
  return 1
}

usage() { # exit code
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

main() {
  [[ $# -ge 1 ]] || usage
  local cmd=$1
  shift
  case "$cmd" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    fetch) check_java; resolve_jars ;;
    classpath) check_java; resolve_jars; classpath ;;
    logs)
      [[ -f "$LOG_FILE" ]] || die "no broker log at $LOG_FILE"
      tail -n "${SAFEACK_KAFKA_LOG_LINES:-50}" "$LOG_FILE"
      ;;
    run)
      [[ $# -ge 1 ]] || die "usage: $0 run CLASS [ARGS...]"
      check_java
      resolve_jars
      run_tool "$@"
      ;;
    -h | --help | help) usage 0 ;;
    *) log "unknown command '$cmd'"; usage ;;
  esac
}

# Sourced (by ci-kafka-bounce.sh), the script only defines its settings and
# functions.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
