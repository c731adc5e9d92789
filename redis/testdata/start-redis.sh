#!/usr/bin/env bash
# Starts a throwaway redis-server on 127.0.0.1 on a free port, for the tests
# of the flightredis module, and prints its address (host:port) on stdout.
#
#   export REDIS_ADDR=$(redis/testdata/start-redis.sh)
#   redis/testdata/start-redis.sh stop "$REDIS_ADDR"   # when done
#
# It installs Debian's redis-server package if redis-server is missing (as
# root, with apt-get). The server keeps nothing on disk, runs in the
# background, and writes its pid file and log under a temporary directory
# (printed on stderr). "stop ADDR" shuts the server down and deletes that
# directory.
set -euo pipefail

if [ "${1:-}" = stop ]; then
  addr=${2:?usage: start-redis.sh stop HOST:PORT}
  host=${addr%:*} port=${addr##*:}
  dir=$(redis-cli -h "$host" -p "$port" config get dir 2>/dev/null | sed -n 2p || true)
  redis-cli -h "$host" -p "$port" shutdown nosave >/dev/null 2>&1 || true
  # Only a directory this script made (it holds the marker) is deleted.
  if [ -n "$dir" ] && [ -f "$dir/.flightredis-single" ]; then
    pid=$(cat "$dir/redis.pid" 2>/dev/null || true)
    for _ in $(seq 1 50); do
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    rm -rf "$dir"
  fi
  exit 0
fi

if ! command -v redis-server >/dev/null 2>&1; then
  echo "start-redis: installing redis-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq redis-server >&2
fi

# A free port: ask the kernel for one, then hand it to redis-server. Retry on
# the rare race where something else takes it in between.
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
  else
    echo $((20000 + RANDOM % 40000))
  fi
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/flightredis.XXXXXX")
touch "$dir/.flightredis-single"
for attempt in 1 2 3 4 5; do
  port=$(free_port)
  if redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --daemonize yes --dir "$dir" --pidfile "$dir/redis.pid" \
      --logfile "$dir/redis.log" >&2; then
    for _ in $(seq 1 50); do
      if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
        echo "start-redis: redis-server on 127.0.0.1:$port (dir $dir)" >&2
        echo "127.0.0.1:$port"
        exit 0
      fi
      sleep 0.1
    done
  fi
  echo "start-redis: attempt $attempt on port $port failed" >&2
done
cat "$dir/redis.log" >&2 || true
rm -rf "$dir"
exit 1
