#!/usr/bin/env bash
# Starts a throwaway Redis Cluster on 127.0.0.1 for the tests of the
# flightredis module: 6 redis-server processes on free ports, joined as 3
# masters with one replica each. It prints on stdout a single line, the
# comma-separated addresses (host:port) of the 6 nodes, and stops them when
# given "stop" and that line:
#
#   export REDIS_CLUSTER=$(redis/testdata/start-cluster.sh)
#   (cd redis && go test -race -count=1 ./...)      # the suite, on the cluster
#   redis/testdata/start-cluster.sh stop "$REDIS_CLUSTER"
#
# It installs Debian's redis-server package if redis-server or redis-cli is
# missing (as root, with apt-get). Each node runs in the background
# (daemonized) from a directory of its own under a temporary directory
# (printed on stderr): its redis.conf, its cluster state (nodes.conf), pid
# file and log; it persists nothing else. "redis-server <its dir>/redis.conf"
# starts a stopped node again with its identity: it rejoins the cluster (as
# a replica if its slots went to another node meanwhile). The failover test
# does that after it kills a master. cluster-node-timeout is 2s, so a dead
# master is replaced by its replica within a few seconds.
#
# The script returns once every node reports cluster_state:ok with all
# 16384 slots served, every node knows the 6 nodes, and every replica is in
# sync with its master. When the cluster cannot be started it prints the
# nodes' logs on stderr and exits non-zero: it never skips.
#
# "stop ADDRS" shuts down every node of ADDRS (those already gone are
# ignored) and deletes the temporary directory.
set -euo pipefail

nodes=6
say() { echo "start-cluster: $*" >&2; }

# stop_cluster shuts down the nodes of a comma-separated address list and
# removes the directory they ran from.
stop_cluster() {
  local addrs=$1 addr host port dir root=""
  for addr in ${addrs//,/ }; do
    host=${addr%:*} port=${addr##*:}
    dir=$(redis-cli -h "$host" -p "$port" config get dir 2>/dev/null | sed -n 2p || true)
    if [ -n "$dir" ] && [ -f "$dir/../.flightredis-cluster" ]; then
      root=$(cd "$dir/.." && pwd)
    fi
    # NOW: do not wait for lagging replicas (Redis 7); older servers refuse
    # the flag, so plain NOSAVE follows.
    redis-cli -h "$host" -p "$port" shutdown nosave now >/dev/null 2>&1 ||
      redis-cli -h "$host" -p "$port" shutdown nosave >/dev/null 2>&1 || true
  done
  if [ -n "$root" ]; then
    # Any node that did not answer (hung): stop it by its pid file.
    local pidfile
    for pidfile in "$root"/*/redis.pid; do
      [ -f "$pidfile" ] || continue
      kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
    done
    rm -rf "$root"
  fi
}

if [ "${1:-}" = stop ]; then
  [ $# -eq 2 ] || { echo "usage: $0 stop ADDR,ADDR,..." >&2; exit 2; }
  stop_cluster "$2"
  exit 0
fi
[ $# -eq 0 ] || { echo "usage: $0 [stop ADDR,ADDR,...]" >&2; exit 2; }

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  say "installing redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq redis-server >&2
fi

# free_port prints a port p such that p and its cluster bus port p+10000
# are both free on 127.0.0.1 (redis-server could still lose one to a race:
# the caller retries).
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 - <<'EOF'
import socket
for _ in range(200):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    if p + 10000 > 65535:
        a.close(); continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 10000))
    except OSError:
        a.close(); b.close(); continue
    a.close(); b.close(); print(p); break
EOF
  else
    echo $((20000 + RANDOM % 30000))
  fi
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/flightredis-cluster.XXXXXX")
touch "$dir/.flightredis-cluster" # marks the directory stop may delete
addrs=()

fail() {
  say "$*"
  local log
  for log in "$dir"/*/redis.log; do
    [ -f "$log" ] || continue
    echo "---- $log" >&2
    tail -n 50 "$log" >&2 || true
  done
  if [ ${#addrs[@]} -gt 0 ]; then
    stop_cluster "$(IFS=,; echo "${addrs[*]}")"
  fi
  rm -rf "$dir"
  exit 1
}

# start_node starts one node on a free port and appends its address to
# addrs.
start_node() {
  local attempt port node
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    [ -n "$port" ] || continue
    node="$dir/$port"
    mkdir -p "$node"
    cat >"$node/redis.conf" <<EOF
bind 127.0.0.1
port $port
dir $node
daemonize yes
pidfile $node/redis.pid
logfile $node/redis.log
save ""
appendonly no
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
EOF
    if redis-server "$node/redis.conf" >&2; then
      local _
      for _ in $(seq 1 50); do
        if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
          addrs+=("127.0.0.1:$port")
          return 0
        fi
        sleep 0.1
      done
    fi
    say "node on port $port did not start (attempt $attempt)"
    [ -f "$node/redis.pid" ] && kill -KILL "$(cat "$node/redis.pid")" 2>/dev/null || true
    rm -rf "$node"
  done
  return 1
}

for _ in $(seq 1 $nodes); do
  start_node || fail "could not start $nodes redis-server nodes"
done

say "creating the cluster: ${addrs[*]}"
if ! redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
  cat "$dir/create.log" >&2
  fail "redis-cli --cluster create failed"
fi

# healthy reports whether every node sees the whole cluster working, and
# every replica is in sync with its master.
healthy() {
  local addr host port info masters=0
  for addr in "${addrs[@]}"; do
    host=${addr%:*} port=${addr##*:}
    info=$(redis-cli -h "$host" -p "$port" cluster info 2>/dev/null | tr -d '\r') || return 1
    grep -qx 'cluster_state:ok' <<<"$info" || return 1
    grep -qx 'cluster_slots_ok:16384' <<<"$info" || return 1
    grep -qx "cluster_known_nodes:$nodes" <<<"$info" || return 1
    info=$(redis-cli -h "$host" -p "$port" info replication 2>/dev/null | tr -d '\r') || return 1
    if grep -qx 'role:slave' <<<"$info"; then
      grep -qx 'master_link_status:up' <<<"$info" || return 1
      grep -qx 'master_sync_in_progress:0' <<<"$info" || return 1
    else
      masters=$((masters + 1))
    fi
  done
  [ "$masters" -eq $((nodes / 2)) ] || return 1
  # Every node agrees on who serves which slot.
  redis-cli --cluster check "${addrs[0]}" >/dev/null 2>&1
}

for _ in $(seq 1 300); do # 30s
  if healthy; then
    say "cluster of $nodes nodes up (dir $dir)"
    (IFS=,; echo "${addrs[*]}")
    exit 0
  fi
  sleep 0.1
done
for addr in "${addrs[@]}"; do
  echo "---- cluster info of $addr" >&2
  redis-cli -h "${addr%:*}" -p "${addr##*:}" cluster info >&2 2>&1 || true
done
redis-cli --cluster check "${addrs[0]}" >&2 2>&1 || true
fail "the cluster did not become healthy within 30s"
