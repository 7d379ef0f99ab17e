#!/usr/bin/env bash
# A real Flink cluster, a real Spark cluster and Prism on this machine, for trying and testing
# `tokenmill prepare` on Beam's cluster runners.
#
#   scripts/cluster.sh install [flink|spark|prism|s3|gcs|hosts|all]  fetch the engines, build the job servers
#   scripts/cluster.sh up      [flink|spark|pool|s3|gcs|all]    start (again: restarts what died)
#   scripts/cluster.sh up      hosts                     Flink and Spark on hosts sharing no disk (as root; below)
#   scripts/cluster.sh down    [flink|spark|pool|s3|gcs|hosts|all]  stop
#   scripts/cluster.sh kill-host N                       every process of host N at once (a lost machine)
#   scripts/cluster.sh status                            what runs, and where
#   scripts/cluster.sh flags   flink|flink-external|spark|prism|hosts|hosts-spark   the `prepare` flags for it
#   scripts/cluster.sh env     s3|gcs|hosts              `export ...` lines that reach that store server
#
# s3: Versity's S3 gateway (Apache-2.0, POSIX backend under .cluster/run/s3/data), on 127.0.0.1
# only, with credentials generated at first `up` (.cluster/run/s3/credentials, mode 600) and a
# bucket named tokenmill. `eval "$(scripts/cluster.sh env s3)"`, then s3://tokenmill/... works.
# gcs: fake-gcs-server (BSD-2), the closest thing to GCS that runs here, on 127.0.0.1, bucket
# tokenmill; `eval "$(scripts/cluster.sh env gcs)"` points Google's client at it.
#
# Versions: cluster/versions.env (engines, Prism) and the venv's apache-beam (job servers).
# Everything lands in .cluster/ (TOKENMILL_CLUSTER_HOME): engines, jars, pid files, logs.
# Ports (env overrides): FLINK_REST_PORT 8081, SPARK_MASTER_PORT 7077, SPARK_UI_PORT 8080,
# SPARK_WORKER_UI_PORT 8082, POOL_PORT 50000, S3_PORT 7070, GCS_PORT 4443; FLINK_TASKMANAGERS 2;
# hosts: HOSTS_REST_PORT 8091, HOSTS_S3_PORT 7071, HOSTS_SPARK_UI_PORT 8092, HOSTS_SPARK_JOB_PORT
# 8099, HOSTS_SPARK_ARTIFACT_PORT 8098, HOSTS_WORKERS 2, HOSTS_NET 10.77.0, HOSTS_PREFIX tmh.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../cluster/versions.env
source "$ROOT/cluster/versions.env"
PY=${PYTHON:-$ROOT/.venv/bin/python}
HOME_DIR=${TOKENMILL_CLUSTER_HOME:-$ROOT/.cluster}
RUN=$HOME_DIR/run
FLINK_HOME=$HOME_DIR/flink/pyflink
SPARK_HOME=$HOME_DIR/spark/pyspark
FLINK_MINOR=${FLINK_VERSION%.*}
FLINK_REST_PORT=${FLINK_REST_PORT:-8081}
FLINK_TASKMANAGERS=${FLINK_TASKMANAGERS:-2}
SPARK_MASTER_PORT=${SPARK_MASTER_PORT:-7077}
SPARK_UI_PORT=${SPARK_UI_PORT:-8080}
SPARK_WORKER_UI_PORT=${SPARK_WORKER_UI_PORT:-8082}
POOL_PORT=${POOL_PORT:-50000}
S3_PORT=${S3_PORT:-7070}
S3_BUCKET=${S3_BUCKET:-tokenmill}
S3_RUN=${S3_RUN:-$RUN/s3}  # its data, credentials, pid and log
GCS_PORT=${GCS_PORT:-4443}
GCS_BUCKET=${GCS_BUCKET:-tokenmill}
GCS_RUN=${GCS_RUN:-$RUN/gcs}
# hosts (see "hosts" below): namespaces HOSTS_PREFIX-hub, -h0 (JobManager, S3), -h1..-hN (workers)
HOSTS_PREFIX=${HOSTS_PREFIX:-tmh}
HOSTS_NET=${HOSTS_NET:-10.77.0}  # a /24 that exists only inside those namespaces
HOSTS_WORKERS=${HOSTS_WORKERS:-2}
HOSTS_REST_PORT=${HOSTS_REST_PORT:-8091}
HOSTS_S3_PORT=${HOSTS_S3_PORT:-7071}
HOSTS_SPARK_UI_PORT=${HOSTS_SPARK_UI_PORT:-8092}  # h0's Spark Master UI, from here
HOSTS_SPARK_JOB_PORT=${HOSTS_SPARK_JOB_PORT:-8099}  # h0's Spark job server and its artifact port,
HOSTS_SPARK_ARTIFACT_PORT=${HOSTS_SPARK_ARTIFACT_PORT:-8098}  # at the same numbers here
HOSTS_RUN=${HOSTS_RUN:-$RUN/hosts}
# what a host cannot see: the checkout's parent folder (the work tree, OUTs and data beside it),
# homes and scratch folders; /tmp is each host's own
_beside=$(dirname "$ROOT"); [ "$_beside" = / ] && _beside=$ROOT  # (a checkout at /NAME: itself)
HOSTS_HIDE=${HOSTS_HIDE:-$_beside /root /home /var/tmp /mnt /media /srv}
# Spark 3.2 predates its own Java 17 support (3.3 passes these itself); the executors the worker
# starts inherit them through the java launcher's JDK_JAVA_OPTIONS.
JAVA17_OPENS="--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
 --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
 --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
 --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
 --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
 --add-opens=java.base/sun.nio.cs=ALL-UNNAMED --add-opens=java.base/sun.security.action=ALL-UNNAMED
 --add-opens=java.base/sun.util.calendar=ALL-UNNAMED"

die() { echo "cluster.sh: $*" >&2; exit 1; }

beam_version() {
  [ -x "$PY" ] || die "no Python at $PY: run 'make setup-data' first (or set PYTHON)"
  "$PY" -c 'import apache_beam; print(apache_beam.__version__)' 2>/dev/null \
    || die "$PY has no apache-beam: run 'make setup-data' first"
}

flink_jar() { echo "$HOME_DIR/jars/beam-runners-flink-$FLINK_MINOR-job-server-$(beam_version).jar"; }
spark_jar() { echo "$HOME_DIR/jars/beam-runners-spark-3-job-server-$(beam_version).jar"; }
prism_bin() { echo "$HOME_DIR/bin/prism-$PRISM_VERSION"; }
s3_bin() { echo "$HOME_DIR/bin/versitygw-$VERSITYGW_VERSION"; }
gcs_bin() { echo "$HOME_DIR/bin/fake-gcs-server-$FAKE_GCS_VERSION"; }

# ---- install ---------------------------------------------------------------------------------

pip_engine() {  # folder, packages...: PyPI's engine packages without their Python dependencies
  local dir=$1; shift
  [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$*" ] && return
  rm -rf "$dir"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "$@"
  echo "$*" > "$dir/.installed"
}

build_jars() {
  local beam; beam=$(beam_version)
  [ -f "$(flink_jar)" ] && [ -f "$(spark_jar)" ] && return
  command -v mvn >/dev/null || die "the job servers are built with Maven: install mvn"
  echo "building Beam $beam's Flink $FLINK_MINOR and Spark 3 job servers (Maven Central)..."
  mvn -q -B -f "$ROOT/cluster/pom.xml" -Dbeam.version="$beam" -Dflink.minor="$FLINK_MINOR" \
    -Dspark.version="$SPARK_VERSION" -Dspark.scala.version="$SPARK_SCALA_VERSION" package
  mkdir -p "$HOME_DIR/jars"
  cp "$ROOT/cluster/flink-job-server/target/$(basename "$(flink_jar)")" "$(flink_jar)"
  cp "$ROOT/cluster/spark-job-server/target/$(basename "$(spark_jar)")" "$(spark_jar)"
}

install_flink() {
  pip_engine "$HOME_DIR/flink" "apache-flink==$FLINK_VERSION" "apache-flink-libraries==$FLINK_VERSION"
  build_jars
}

install_spark() {
  pip_engine "$HOME_DIR/spark" "pyspark==$SPARK_VERSION"
  build_jars
}

go_tool() {  # binary module what: a Go tool built with `go install` into $HOME_DIR/bin as binary
  local bin=$1 module=$2 what=$3
  [ -x "$bin" ] && return
  command -v go >/dev/null || die "$what is built with Go: install go"
  mkdir -p "$HOME_DIR/bin"
  echo "building $what (Go module proxy)..."
  GOBIN="$HOME_DIR/bin" go install "$module"
  local built=${module%@*}
  mv "$HOME_DIR/bin/${built##*/}" "$bin"
}

install_prism() { go_tool "$(prism_bin)" "github.com/apache/beam/sdks/v2/go/cmd/prism@v$PRISM_VERSION" "Prism"; }
install_s3() {
  go_tool "$(s3_bin)" "github.com/versity/versitygw/cmd/versitygw@v$VERSITYGW_VERSION" "Versity's S3 gateway (~3 min)"
}
install_gcs() { go_tool "$(gcs_bin)" "github.com/fsouza/fake-gcs-server@v$FAKE_GCS_VERSION" "fake-gcs-server"; }

# ---- processes -------------------------------------------------------------------------------

alive() {  # a pid file's process runs (a SIGKILLed one is dead while it still exits: state Z or X)
  [ -f "$1" ] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$(cat "$1")/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

spawn() {  # pidfile logfile command...: a daemon in its own session, its pid in pidfile
  local pidfile=$1 log=$2; shift 2
  alive "$pidfile" && return
  mkdir -p "$(dirname "$pidfile")" "$(dirname "$log")"
  setsid "$@" > "$log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
}

stop() {  # pidfile: TERM, then KILL after 10 s
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

wait_for() {  # what, seconds, command...: until the command succeeds
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 2))); do "$@" >/dev/null 2>&1 && return; sleep 0.5; done
  die "$what did not come up in ${secs} s (logs: $RUN, hosts: $HOSTS_RUN/h*/log, $HOSTS_RUN/forward.out)"
}

http_json() { "$PY" -c 'import json,sys,urllib.request; print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=5))))' "$1"; }

flink_taskmanagers() { http_json "http://localhost:$FLINK_REST_PORT/taskmanagers" \
  | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)["taskmanagers"]))'; }

spark_workers() { http_json "http://127.0.0.1:$SPARK_UI_PORT/json/" \
  | "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("aliveworkers", 0))'; }

flink_conf() {  # conf-dir jobmanager-address own-address tmp-dir rest-port [jobmanager-bind]: a Flink config.yaml
  local conf=$1 jm=$2 own=$3 tmp=$4 rest=$5 bind=${6:-$2}
  mkdir -p "$conf" "$tmp"
  cp "$FLINK_HOME"/conf/log4j*.properties "$FLINK_HOME"/conf/logback*.xml "$conf/"
  cat > "$conf/config.yaml" <<EOF
# written by scripts/cluster.sh
jobmanager:
  rpc: {address: $jm, port: 6123}
  bind-host: $bind
  memory: {process: {size: 1024m}}
taskmanager:
  bind-host: $own
  host: $own
  numberOfTaskSlots: 1
  # a Beam batch job runs all its stages' tasks in a slot at once, each with its own network
  # buffers: Flink's default share (10% of ~1 GB) ran out on 3,000 pages
  memory: {process: {size: 2560m}, network: {min: 512m, max: 512m}}
rest: {address: $jm, bind-address: $jm, port: $rest}
parallelism: {default: 2}
# a lost task manager: noticed within seconds, and the job restarts instead of failing (a lost
# host's slot comes back with a new host: a restart waits for it)
heartbeat: {interval: 2000, timeout: 10000}
restart-strategy:
  type: fixed-delay
  fixed-delay: {attempts: 5, delay: 3 s}
io: {tmp: {dirs: $tmp}}
EOF
}

up_flink() {
  [ -d "$FLINK_HOME" ] || die "no Flink in $HOME_DIR: run 'scripts/cluster.sh install flink' first"
  flink_conf "$RUN/flink/conf" localhost localhost "$RUN/flink/tmp" "$FLINK_REST_PORT"
  local env=(env FLINK_CONF_DIR="$RUN/flink/conf" FLINK_LOG_DIR="$RUN/flink/log" FLINK_PID_DIR="$RUN/flink/daemon")
  spawn "$RUN/flink/jobmanager.pid" "$RUN/flink/log/jobmanager.out" \
    "${env[@]}" "$FLINK_HOME/bin/jobmanager.sh" start-foreground
  wait_for "Flink's JobManager (localhost:$FLINK_REST_PORT)" 60 http_json "http://localhost:$FLINK_REST_PORT/overview"
  local i
  for i in $(seq "$FLINK_TASKMANAGERS"); do
    spawn "$RUN/flink/taskmanager-$i.pid" "$RUN/flink/log/taskmanager-$i.out" \
      "${env[@]}" "$FLINK_HOME/bin/taskmanager.sh" start-foreground -Dtaskmanager.resource-id="tm-$i-$RANDOM"
  done
  wait_for "$FLINK_TASKMANAGERS Flink TaskManagers" 60 \
    bash -c "[ \"\$(\"$0\" _flink_taskmanagers)\" -ge $FLINK_TASKMANAGERS ]"
  echo "flink: JobManager and $FLINK_TASKMANAGERS TaskManagers up, http://localhost:$FLINK_REST_PORT"
}

down_flink() {
  local f
  for f in "$RUN"/flink/taskmanager-*.pid; do [ -e "$f" ] && stop "$f"; done
  stop "$RUN/flink/jobmanager.pid"
}

up_spark() {
  [ -d "$SPARK_HOME" ] || die "no Spark in $HOME_DIR: run 'scripts/cluster.sh install spark' first"
  mkdir -p "$RUN/spark/work"
  local env=(env SPARK_HOME="$SPARK_HOME" SPARK_LOCAL_IP=127.0.0.1 SPARK_LOG_DIR="$RUN/spark/log"
    SPARK_CONF_DIR="$RUN/spark/conf")
  mkdir -p "$RUN/spark/conf"
  spawn "$RUN/spark/master.pid" "$RUN/spark/log/master.out" "${env[@]}" \
    "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$SPARK_MASTER_PORT" --webui-port "$SPARK_UI_PORT"
  wait_for "Spark's Master (127.0.0.1:$SPARK_UI_PORT)" 60 http_json "http://127.0.0.1:$SPARK_UI_PORT/json/"
  spawn "$RUN/spark/worker.pid" "$RUN/spark/log/worker.out" "${env[@]}" JDK_JAVA_OPTIONS="$(echo $JAVA17_OPENS)" \
    "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 \
    --cores "${SPARK_WORKER_CORES:-2}" --memory "${SPARK_WORKER_MEMORY:-4g}" \
    --webui-port "$SPARK_WORKER_UI_PORT" --work-dir "$RUN/spark/work" "spark://127.0.0.1:$SPARK_MASTER_PORT"
  wait_for "Spark's Worker" 60 bash -c "[ \"\$(\"$0\" _spark_workers)\" -ge 1 ]"
  echo "spark: Master and Worker up, spark://127.0.0.1:$SPARK_MASTER_PORT (UI http://127.0.0.1:$SPARK_UI_PORT)"
}

down_spark() {
  stop "$RUN/spark/worker.pid"
  stop "$RUN/spark/master.pid"
}

up_pool() {  # Beam's worker pool, for --environment_type=EXTERNAL: SDK workers from the venv
  spawn "$RUN/pool/pool.pid" "$RUN/pool/pool.out" env PATH="$(dirname "$PY"):$PATH" \
    "$PY" -m tokenmill.pipelines.worker_pool --service_port="$POOL_PORT"
  wait_for "Beam's worker pool (localhost:$POOL_PORT)" 30 \
    "$PY" -c "import socket; socket.create_connection(('localhost', $POOL_PORT), 1)"
  echo "pool: Beam worker pool up, localhost:$POOL_PORT"
}

down_pool() { stop "$RUN/pool/pool.pid"; }

s3_credentials() {  # [dir]: generated once, kept for the next `up`: KEY SECRET
  local dir=${1:-$S3_RUN}
  local f=$dir/credentials
  if [ ! -s "$f" ]; then
    mkdir -p "$dir"
    (umask 077; "$PY" -c 'import secrets; print("TM" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))' > "$f")
  fi
  cat "$f"
}

up_s3() {
  [ -x "$(s3_bin)" ] || die "no S3 gateway in $HOME_DIR: run 'scripts/cluster.sh install s3' first"
  local key secret
  read -r key secret < <(s3_credentials)
  mkdir -p "$S3_RUN/data/$S3_BUCKET"
  # the credentials reach the server through its environment, never its command line (ps shows that)
  spawn "$S3_RUN/s3.pid" "$S3_RUN/s3.out" env ROOT_ACCESS_KEY="$key" ROOT_SECRET_KEY="$secret" \
    "$(s3_bin)" --port "127.0.0.1:$S3_PORT" --keep-alive --quiet posix "$S3_RUN/data"
  wait_for "the S3 gateway (127.0.0.1:$S3_PORT)" 30 \
    "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $S3_PORT), 1)"
  echo "s3: Versity S3 gateway up, http://127.0.0.1:$S3_PORT, bucket s3://$S3_BUCKET (eval \"\$(scripts/cluster.sh env s3)\")"
}

down_s3() { stop "$S3_RUN/s3.pid"; }

up_gcs() {
  [ -x "$(gcs_bin)" ] || die "no fake-gcs-server in $HOME_DIR: run 'scripts/cluster.sh install gcs' first"
  mkdir -p "$GCS_RUN/data/$GCS_BUCKET"
  spawn "$GCS_RUN/gcs.pid" "$GCS_RUN/gcs.out" "$(gcs_bin)" -scheme http -host 127.0.0.1 -port "$GCS_PORT" \
    -public-host "127.0.0.1:$GCS_PORT" -backend filesystem -filesystem-root "$GCS_RUN/data" -log-level warn
  wait_for "fake-gcs-server (127.0.0.1:$GCS_PORT)" 30 \
    "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$GCS_PORT/storage/v1/b/$GCS_BUCKET', timeout=2)"
  echo "gcs: fake-gcs-server up, http://127.0.0.1:$GCS_PORT, bucket gs://$GCS_BUCKET (eval \"\$(scripts/cluster.sh env gcs)\")"
}

down_gcs() { stop "$GCS_RUN/gcs.pid"; }

env_gcs() { echo "export STORAGE_EMULATOR_HOST=http://127.0.0.1:$GCS_PORT NO_GCE_CHECK=true"; }

env_s3() {  # [credentials-dir port]: this machine's S3 server, or the hosts' (env_hosts)
  local key secret
  read -r key secret < <(s3_credentials "${1:-$S3_RUN}")
  echo "export AWS_ENDPOINT_URL=http://127.0.0.1:${2:-$S3_PORT} AWS_REGION=us-east-1"
  echo "export AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=$secret"
}

# ---- hosts: a Flink cluster of several hosts on this machine ---------------------------------
#
# Each host is a network namespace of the project's own (HOSTS_PREFIX-hN, address HOSTS_NET.1N on
# a bridge in the namespace HOSTS_PREFIX-hub) and a mount namespace in which the launcher's files
# do not exist: tmpfs over the work tree's parent folder, /root, /home, /dev/shm and the like, its
# own /tmp on its own disk (HOSTS_RUN/hN/disk, wiped when the host starts), and only its "image"
# bound back read-only: Python and the venv, the tokenmill package, Flink, Spark, the job-server
# jars, the S3 server. h0 runs Flink's JobManager, Spark's Master, Beam's Spark job server (the
# Spark driver: executors call it back) and the S3 server; h1..hHOSTS_WORKERS each a TaskManager,
# a Spark Worker and a tokenmill worker pool (EXTERNAL environment, on the host's own
# localhost:POOL_PORT), whose workers reach the S3 server at h0's address. The launcher stays in
# this machine's namespace: a forwarder (netns_forward.py) gives it h0's services on loopback
# ports (HOSTS_*_PORT). Nothing but those exists outside the namespaces; `down hosts` removes all.

need_netns() {
  [ "$(id -u)" = 0 ] || die "hosts: network namespaces need root"
  command -v ip >/dev/null && command -v unshare >/dev/null || die "hosts: needs ip (iproute2) and unshare"
}

host_ns() { echo "$HOSTS_PREFIX-h$1"; }
host_addr() { echo "$HOSTS_NET.$((10 + $1))"; }

hosts_net_up() {  # the hub's bridge and one namespace per host, joined by veth pairs
  local hub=$HOSTS_PREFIX-hub i ns
  if ! ip netns list | grep -qx "$hub\( .*\)\?"; then
    ip netns add "$hub"
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" link set br0 up
  fi
  for i in $(seq 0 "$HOSTS_WORKERS"); do
    ns=$(host_ns "$i")
    ip netns list | grep -qx "$ns\( .*\)\?" && continue
    ip netns add "$ns"
    ip link add "$ns-e" type veth peer name "$ns-b"
    ip link set "$ns-e" netns "$ns"
    ip link set "$ns-b" netns "$hub"
    ip -n "$hub" link set "$ns-b" master br0 up
    ip -n "$ns" link set "$ns-e" name eth0
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

hosts_image() {  # what a host's image holds, bound back read-only: Python and the venv, tokenmill, Flink, the S3 server
  echo "$("$PY" -c 'import sys; print(sys.base_prefix)')" "$(dirname "$PY")/.." "$ROOT/tokenmill" "$HOME_DIR/flink" \
    "$HOME_DIR/spark" "$HOME_DIR/jars" "$HOME_DIR/bin"
}

host_main() {  # N: runs as host N's first process, inside its network and mount namespaces
  local n=$1 disk=$HOSTS_RUN/h$1/disk log=$HOSTS_RUN/h$1/log p i=0 key secret
  local keep=() ro=()
  read -r key secret < "$HOSTS_RUN/credentials"  # what the host's image is given (the launcher's disk is gone below)
  local tm_id; tm_id=$(cat "$HOSTS_RUN/h$n/tm-id" 2>/dev/null || echo "h$n")
  for p in $(hosts_image); do ro+=("$(cd "$p" && pwd -P)"); done
  keep=("${ro[@]}" "$disk" "$log")
  local stage=/run/$HOSTS_PREFIX-stage  # the paths this host keeps, held here while the rest is hidden
  mkdir -p "$stage"
  mount -t tmpfs stage "$stage"
  for p in "${keep[@]}"; do mkdir -p "$stage/k$i"; mount --bind "$p" "$stage/k$i"; i=$((i + 1)); done
  for p in $HOSTS_HIDE /tmp; do [ -d "$p" ] && mount -t tmpfs hidden "$p"; done
  i=0
  for p in "${keep[@]}"; do mkdir -p "$p"; mount --bind "$stage/k$i" "$p"; i=$((i + 1)); done
  for p in "${ro[@]}"; do mount -o remount,bind,ro "$p"; done
  umount -l "$stage"
  mkdir -p "$disk/tmp"
  mount --bind "$disk/tmp" /tmp
  mountpoint -q /dev/shm && mount -t tmpfs shm /dev/shm
  cd "$disk"  # (a working directory in the hidden tree would still reach it)
  local addr; addr=$(host_addr "$n")
  local fenv=(env HOME="$disk" FLINK_CONF_DIR="$disk/conf" FLINK_LOG_DIR="$log" FLINK_PID_DIR="$disk")
  local senv=(env HOME="$disk" SPARK_HOME="$SPARK_HOME" SPARK_LOCAL_IP="$addr" SPARK_LOG_DIR="$log"
    SPARK_CONF_DIR="$disk/spark-conf" SPARK_PID_DIR="$disk")
  mkdir -p "$disk/spark-conf" "$disk/spark-work"
  # the JobManager's REST handlers reach its blob server at "localhost": h0 listens on all its addresses
  flink_conf "$disk/conf" "$(host_addr 0)" "$addr" "$disk/tmp/flink" 8081 0.0.0.0
  if [ "$n" = 0 ]; then
    mkdir -p "$disk/s3/$S3_BUCKET"
    env ROOT_ACCESS_KEY="$key" ROOT_SECRET_KEY="$secret" "$(s3_bin)" --port "$addr:7070" --keep-alive --quiet \
      posix "$disk/s3" > "$log/s3.out" 2>&1 < /dev/null &
    "${fenv[@]}" "$FLINK_HOME/bin/jobmanager.sh" start-foreground > "$log/jobmanager.out" 2>&1 < /dev/null &
    # Spark: the Master, and Beam's Spark job server, whose SparkContext is the driver the
    # executors call back (so it runs here, as on a cluster's edge node, not in the launcher)
    "${senv[@]}" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master --host "$addr" --port 7077 \
      --webui-port 8080 > "$log/spark-master.out" 2>&1 < /dev/null &
    env HOME="$disk" java -Dspark.driver.host="$addr" -Dspark.driver.bindAddress="$addr" -jar "$(spark_jar)" \
      --spark-master-url "spark://$addr:7077" --job-host localhost --job-port "$HOSTS_SPARK_JOB_PORT" \
      --artifact-port "$HOSTS_SPARK_ARTIFACT_PORT" --expansion-port 0 --artifacts-dir "$disk/tmp/artifacts" \
      > "$log/spark-job-server.out" 2>&1 < /dev/null &
  else
    "${fenv[@]}" "$FLINK_HOME/bin/taskmanager.sh" start-foreground -Dtaskmanager.resource-id="$tm_id" \
      > "$log/taskmanager.out" 2>&1 < /dev/null &
    env HOME="$disk" PATH="$(dirname "$PY"):$PATH" AWS_ENDPOINT_URL="http://$(host_addr 0):7070" AWS_REGION=us-east-1 \
      AWS_ACCESS_KEY_ID="$key" AWS_SECRET_ACCESS_KEY="$secret" \
      "$PY" -m tokenmill.pipelines.worker_pool --service_port="$POOL_PORT" > "$log/pool.out" 2>&1 < /dev/null &
    "${senv[@]}" JDK_JAVA_OPTIONS="$(echo $JAVA17_OPENS)" "$SPARK_HOME/bin/spark-class" \
      org.apache.spark.deploy.worker.Worker --host "$addr" --cores "${SPARK_WORKER_CORES:-2}" \
      --memory "${SPARK_WORKER_MEMORY:-4g}" --webui-port 8082 --work-dir "$disk/spark-work" \
      "spark://$(host_addr 0):7077" > "$log/spark-worker.out" 2>&1 < /dev/null &
  fi
  wait
}

host_alive() { alive "$HOSTS_RUN/h$1/host.pid" && [ -n "$(ip netns pids "$(host_ns "$1")" 2>/dev/null)" ]; }

start_host() {  # N: a fresh host N (a worker host's disk starts empty, as a new machine's)
  local n=$1
  host_alive "$n" && return
  kill_host "$n" > /dev/null 2>&1 || true
  [ "$n" = 0 ] || rm -rf "$HOSTS_RUN/h$n/disk"
  mkdir -p "$HOSTS_RUN/h$n/disk" "$HOSTS_RUN/h$n/log"
  echo "h$n-$(date +%s%N)" > "$HOSTS_RUN/h$n/tm-id"  # this start's TaskManager (a lost one lingers in the JobManager)
  spawn "$HOSTS_RUN/h$n/host.pid" "$HOSTS_RUN/h$n/log/host.out" \
    ip netns exec "$(host_ns "$n")" unshare --mount --propagation private --pid --fork --mount-proc "$0" _host "$n"
}

kill_host() {  # N: every process of host N at once, as a machine that is lost
  local n=$1 pids forwarder
  forwarder=$(cat "$HOSTS_RUN/forward.pid" 2>/dev/null || true)  # it joins h0's network, not the host
  pids=$(ip netns pids "$(host_ns "$n")" 2>/dev/null | grep -vx "${forwarder:-none}" || true)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  rm -f "$HOSTS_RUN/h$n/host.pid"
  echo "hosts: host $n ($(host_addr "$n")) killed"
}

hosts_rest() { http_json "http://127.0.0.1:$HOSTS_REST_PORT/$1"; }

hosts_ready() {  # every worker host's own TaskManager and Spark Worker registered (not a lost host's)
  local i id flink spark
  flink=$(hosts_rest taskmanagers) || return 1
  spark=$(http_json "http://127.0.0.1:$HOSTS_SPARK_UI_PORT/json/") || return 1
  for i in $(seq "$HOSTS_WORKERS"); do
    id=$(cat "$HOSTS_RUN/h$i/tm-id") || return 1
    "$PY" -c 'import json,sys; sys.exit(sys.argv[2] not in [m["id"] for m in json.loads(sys.argv[1])["taskmanagers"]])' \
      "$flink" "$id" || return 1
    id=$(ip netns exec "$(host_ns "$i")" "$PY" -c 'import json,sys,urllib.request as u
print(json.load(u.urlopen(f"http://{sys.argv[1]}:8082/json/", timeout=2))["id"])' "$(host_addr "$i")") || return 1
    "$PY" -c 'import json,sys; sys.exit(sys.argv[2] not in [w["id"] for w in json.loads(sys.argv[1])["workers"]
                                                          if w["state"] == "ALIVE"])' "$spark" "$id" || return 1
  done
}

up_hosts() {
  need_netns
  [ -d "$FLINK_HOME" ] || die "no Flink in $HOME_DIR: run 'scripts/cluster.sh install flink' first"
  [ -x "$(s3_bin)" ] || die "no S3 gateway in $HOME_DIR: run 'scripts/cluster.sh install s3' first"
  [ -d "$SPARK_HOME" ] && [ -f "$(spark_jar)" ] || die "no Spark in $HOME_DIR: run 'scripts/cluster.sh install hosts' first"
  hosts_net_up
  s3_credentials "$HOSTS_RUN" > /dev/null
  local i
  for i in $(seq 0 "$HOSTS_WORKERS"); do start_host "$i"; done
  # (the Spark job server listens on h0's own loopback, and names its artifact port to the
  # launcher as localhost's: forwarded at the same numbers)
  spawn "$HOSTS_RUN/forward.pid" "$HOSTS_RUN/forward.out" "$PY" "$ROOT/scripts/netns_forward.py" "$(host_ns 0)" \
    "127.0.0.1:$HOSTS_REST_PORT=$(host_addr 0):8081" "127.0.0.1:$HOSTS_S3_PORT=$(host_addr 0):7070" \
    "127.0.0.1:$HOSTS_SPARK_UI_PORT=$(host_addr 0):8080" \
    "127.0.0.1:$HOSTS_SPARK_JOB_PORT=127.0.0.1:$HOSTS_SPARK_JOB_PORT" \
    "127.0.0.1:$HOSTS_SPARK_ARTIFACT_PORT=127.0.0.1:$HOSTS_SPARK_ARTIFACT_PORT"
  wait_for "the hosts' JobManager (h0, via 127.0.0.1:$HOSTS_REST_PORT)" 90 hosts_rest overview
  wait_for "the hosts' S3 server (h0, via 127.0.0.1:$HOSTS_S3_PORT)" 30 \
    "$PY" -c "import urllib.request as u, urllib.error as e
try: u.urlopen('http://127.0.0.1:$HOSTS_S3_PORT/', timeout=2)
except e.HTTPError: pass  # it answers (anonymous: 403)"
  wait_for "each worker host's TaskManager and Spark Worker" 120 hosts_ready
  wait_for "the Spark job server (h0, via 127.0.0.1:$HOSTS_SPARK_JOB_PORT)" 90 "$PY" -c "import grpc
from apache_beam.portability.api import beam_job_api_pb2 as api, beam_job_api_pb2_grpc as rpc
rpc.JobServiceStub(grpc.insecure_channel('127.0.0.1:$HOSTS_SPARK_JOB_PORT')).GetJobs(api.GetJobsRequest(), timeout=3)"
  echo "hosts: Flink's JobManager, Spark's Master and job server, S3 on h0 ($(host_addr 0)); a TaskManager," \
    "a Spark Worker and a worker pool on each of" \
    "$(for i in $(seq "$HOSTS_WORKERS"); do printf 'h%s (%s) ' "$i" "$(host_addr "$i")"; done)"
  echo "hosts: Flink http://127.0.0.1:$HOSTS_REST_PORT, Spark http://127.0.0.1:$HOSTS_SPARK_UI_PORT," \
    "S3 http://127.0.0.1:$HOSTS_S3_PORT (eval \"\$(scripts/cluster.sh env hosts)\";" \
    "scripts/cluster.sh flags hosts|hosts-spark)"
}

down_hosts() {
  command -v ip >/dev/null || return 0
  stop "$HOSTS_RUN/forward.pid"
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$HOSTS_PREFIX-(hub|h[0-9]+)$"); do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns delete "$ns"
  done
  rm -f "$HOSTS_RUN"/h*/host.pid
}

env_hosts() { env_s3 "$HOSTS_RUN" "$HOSTS_S3_PORT"; }  # its S3 server, through the loopback forward

status() {
  local f
  for f in "$RUN"/*/*.pid "$HOSTS_RUN"/h*/host.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then echo "up    ${f#"$RUN"/} (pid $(cat "$f"))"; else echo "dead  ${f#"$RUN"/}"; fi
  done
}

flags() {
  case ${1:-} in
    flink) echo "--runner=FlinkRunner --flink_master=localhost:$FLINK_REST_PORT --flink_version=$FLINK_MINOR" \
      "--flink_job_server_jar=$(flink_jar) --environment_type=LOOPBACK --parallelism=2" ;;
    flink-external) echo "--runner=FlinkRunner --flink_master=localhost:$FLINK_REST_PORT --flink_version=$FLINK_MINOR" \
      "--flink_job_server_jar=$(flink_jar) --environment_type=EXTERNAL" \
      "--environment_config=localhost:$POOL_PORT --parallelism=2" ;;
    spark) echo "--runner=SparkRunner --spark_master_url=spark://127.0.0.1:$SPARK_MASTER_PORT" \
      "--spark_job_server_jar=$(spark_jar) --environment_type=LOOPBACK" ;;
    prism) echo "--runner=PrismRunner --prism_location=$(prism_bin)" ;;
    hosts) echo "--runner=FlinkRunner --flink_master=127.0.0.1:$HOSTS_REST_PORT --flink_version=$FLINK_MINOR" \
      "--flink_job_server_jar=$(flink_jar) --environment_type=EXTERNAL" \
      "--environment_config=localhost:$POOL_PORT --parallelism=$HOSTS_WORKERS" ;;
    hosts-spark) echo "--runner=SparkRunner --spark_master_url=spark://$(host_addr 0):7077" \
      "--job_endpoint=127.0.0.1:$HOSTS_SPARK_JOB_PORT --environment_type=EXTERNAL" \
      "--environment_config=localhost:$POOL_PORT" ;;
    *) die "flags: flink, flink-external, spark, prism, hosts or hosts-spark" ;;
  esac
}

engines() { if [ "${1:-all}" = all ]; then echo "$2"; else echo "$1"; fi; }

cmd=${1:-}; what=${2:-all}
case $cmd in
  install)
    [ "$what" = hosts ] && what="flink spark s3"
    for e in $(engines "$what" "flink spark prism s3 gcs"); do "install_$e"; done ;;
  up) for e in $(engines "$what" "s3 gcs flink spark pool"); do "up_$e"; done ;;
  down) for e in $(engines "$what" "hosts pool spark flink gcs s3"); do "down_$e"; done ;;
  kill-host) [[ $what =~ ^[0-9]+$ ]] || die "kill-host N: the host's number (0 runs the JobManager and S3)"
    need_netns; kill_host "$what" ;;
  env) case $what in s3|gcs|hosts) "env_$what" ;; *) die "env: s3, gcs or hosts" ;; esac ;;
  status) status ;;
  flags) flags "$what" ;;
  _host) host_main "$what" ;;
  _flink_taskmanagers) flink_taskmanagers ;;
  _spark_workers) spark_workers ;;
  *) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
