#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server on 127.0.0.1 on a free port, for the
# tests of the flightpg module, and prints its URL on stdout:
#
#   export PG_URL=$(postgres/testdata/start-postgres.sh)
#   postgres/testdata/start-postgres.sh stop "$PG_URL"   # when done
#
# It installs Debian's postgresql package if initdb or postgres is missing
# (looked for in PATH and in /usr/lib/postgresql/*/bin; as root, with
# apt-get). The cluster is made by initdb in a temporary directory (printed
# on stderr) with wal_level=logical, trust authentication for the superuser
# "postgres", and fsync off (it is thrown away); the server listens on
# 127.0.0.1 and on a unix socket in that directory, and writes its log
# there. "restart URL" restarts it (fast shutdown, same port and data).
# initdb and postgres refuse to run as root: run as root, the script
# runs them as the user "postgres" (created if missing) or, failing that,
# as "nobody", and hands the directory to that user. "stop URL" shuts the
# server down and deletes the directory.
set -euo pipefail

# bindir prints the directory holding initdb, postgres and pg_ctl, or
# nothing when they are missing.
bindir() {
  local d
  if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 &&
    command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_ctl" ]; then
      echo "$d"
      return
    fi
  done
}

# as_owner runs its arguments as the user that owns the cluster: this user,
# or the unprivileged one chosen below when this user is root.
owner=""
as_owner() {
  if [ -z "$owner" ]; then
    "$@"
  elif command -v runuser >/dev/null 2>&1; then
    runuser -u "$owner" -- "$@"
  else
    setpriv --reuid="$owner" --regid="$(id -g "$owner")" --init-groups -- "$@"
  fi
}

if [ "$(id -u)" = 0 ]; then
  if ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres >/dev/null 2>&1 || true
  fi
  if id postgres >/dev/null 2>&1; then owner=postgres; else owner=nobody; fi
fi

# marker names the file, in a directory this script made, that holds the
# server's URL: "stop" deletes only a directory that holds one.
marker=.flightpg-single

if [ "${1:-}" = restart ]; then
  # A fast restart of the server URL names, on the same port and data
  # (the tests of a Source riding out a server restart use it).
  url=${2:?usage: start-postgres.sh restart URL}
  bin=$(bindir)
  data=$("$bin/psql" "$url" -XAtqc 'show data_directory')
  [ -f "$(dirname "$data")/$marker" ] || { echo "start-postgres: $url is not a server this script started" >&2; exit 1; }
  as_owner "$bin/pg_ctl" -D "$data" -l "$(dirname "$data")/postgres.log" -m fast -w -t 60 restart >&2
  exit 0
fi

if [ "${1:-}" = stop ]; then
  url=${2:?usage: start-postgres.sh stop URL}
  bin=$(bindir)
  dirs=()
  # The server says where its data is; its parent is the directory made
  # here. A server that no longer answers is found by its marker.
  if [ -n "$bin" ] && [ -x "$bin/psql" ]; then
    data=$("$bin/psql" "$url" -XAtqc 'show data_directory' 2>/dev/null || true)
    [ -n "$data" ] && dirs+=("$(dirname "$data")")
  fi
  for m in "${TMPDIR:-/tmp}"/flightpg.*/$marker /tmp/flightpg.*/$marker; do
    [ -f "$m" ] && [ "$(cat "$m")" = "$url" ] && dirs+=("$(dirname "$m")")
  done
  for dir in "${dirs[@]}"; do
    [ -f "$dir/$marker" ] && [ "$(cat "$dir/$marker")" = "$url" ] || continue
    [ -d "$dir/data" ] && [ -n "$bin" ] &&
      as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    rm -rf "$dir"
  done
  exit 0
fi

bin=$(bindir)
if [ -z "$bin" ]; then
  echo "start-postgres: installing postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bin=$(bindir)
  [ -n "$bin" ] || { echo "start-postgres: no initdb after installing postgresql" >&2; exit 1; }
fi

# A free port: ask the kernel for one, then hand it to postgres. Retry on
# the rare race where something else takes it in between.
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
  else
    echo $((20000 + RANDOM % 40000))
  fi
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/flightpg.XXXXXX")
if [ -n "$owner" ]; then
  chown "$owner" "$dir"
  if ! as_owner test -w "$dir"; then
    # TMPDIR is not reachable by that user (a root-only parent): use /tmp.
    rm -rf "$dir"
    dir=$(mktemp -d /tmp/flightpg.XXXXXX)
    chown "$owner" "$dir"
  fi
fi

if ! as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust \
    --encoding=UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1; then
  cat "$dir/initdb.log" >&2
  rm -rf "$dir"
  exit 1
fi
cat >>"$dir/data/postgresql.conf" <<EOF

# flightpg tests: logical decoding, a throwaway cluster
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = logical
max_wal_senders = 20
max_replication_slots = 20
fsync = off
full_page_writes = off
EOF

for attempt in 1 2 3 4 5; do
  port=$(free_port)
  if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -o "-p $port" \
      -w -t 60 start >&2; then
    url="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
    echo "$url" >"$dir/$marker"
    echo "start-postgres: postgres on 127.0.0.1:$port (dir $dir)" >&2
    echo "$url"
    exit 0
  fi
  echo "start-postgres: attempt $attempt on port $port failed" >&2
done
cat "$dir/postgres.log" >&2 || true
rm -rf "$dir"
exit 1
