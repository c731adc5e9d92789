#!/bin/sh
# compare.sh REV [ROUNDS [WALLRUNS]]: run this directory's benchmarks on the
# core of this tree ("after") and on the core of commit REV ("before"),
# interleaved, for the report's before → after section. Run from bench/.
#
# REV's core gets this tree's benchmarks (they use only the public API): a
# temporary worktree of REV is made, this directory's go.mod, go.sum and Go
# files are copied into its bench/, and one test binary is built per tree,
# once, so that edits made meanwhile change nothing. Then, ROUNDS times
# (default 8), every benchmark but the expiry wall runs once (-count 1) on
# one tree and then on the other, the order alternating between rounds, so
# that both see the same machine load; the expiry wall (3 s per
# implementation) runs WALLRUNS times (default 3) per tree, interleaved the
# same way. The outputs are concatenated per tree:
#
#	results/before.txt  REV's core
#	results/raw.txt     this tree's core (and results/wall/, the last trace)
#
# Then: go run ./cmd/report -before results/before.txt results/raw.txt
set -eu

rev=${1:?usage: compare.sh REV [ROUNDS [WALLRUNS]]}
rounds=${2:-8}
wallruns=${3:-3}
bench=${BENCH:-'^Benchmark(Coalesce|HitSerial|HitParallel|Memory|ScaleHit|ScaleMiss|Miss|EvictionPressure|GetMany)$'}

tmp=$(mktemp -d)
cleanup() {
	git worktree remove --force "$tmp/before" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

git worktree add --detach "$tmp/before" "$rev" >/dev/null
cp go.mod go.sum ./*.go "$tmp/before/bench/"
# Benchmarks of API that REV does not have yet run on this tree only:
# BEFORE_SKIP lists their files (e.g. getmany_test.go).
for f in ${BEFORE_SKIP:-}; do
	rm -f "$tmp/before/bench/$f"
done
go test -c -o "$tmp/after.test" .
(cd "$tmp/before/bench" && go test -c -o "$tmp/before.test" .)

mkdir -p results/wall
printf 'commit: %s\n' "$(git rev-parse "$rev")" >results/before.txt
printf 'commit: %s\n' "$(git rev-parse HEAD)" >results/raw.txt

# run TREE FLAGS...: one invocation of TREE's binary in TREE's bench/.
run() {
	tree=$1
	shift
	if [ "$tree" = before ]; then
		(cd "$tmp/before/bench" && "$tmp/before.test" "$@") >>results/before.txt
	else
		"$tmp/after.test" "$@" >>results/raw.txt
	fi
}

i=1
while [ "$i" -le "$rounds" ]; do
	order="before after"
	[ $((i % 2)) -eq 0 ] && order="after before"
	for t in $order; do
		echo "round $i/$rounds: $t" >&2
		run "$t" -test.run '^$' -test.bench "$bench" -test.benchmem -test.count 1 -test.timeout 60m
	done
	i=$((i + 1))
done

i=1
while [ "$i" -le "$wallruns" ]; do
	order="before after"
	[ $((i % 2)) -eq 0 ] && order="after before"
	for t in $order; do
		echo "expiry wall $i/$wallruns: $t" >&2
		if [ "$t" = after ]; then
			run after -test.run '^$' -test.bench '^BenchmarkExpiryWall$' -test.benchmem -test.count 1 -test.timeout 10m -walltrace results/wall
		else
			run before -test.run '^$' -test.bench '^BenchmarkExpiryWall$' -test.benchmem -test.count 1 -test.timeout 10m
		fi
	done
	i=$((i + 1))
done
