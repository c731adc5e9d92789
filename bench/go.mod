module github.com/flightcache/flightcache/bench

go 1.26.0

require (
	github.com/dgraph-io/ristretto/v2 v2.4.2
	github.com/flightcache/flightcache v0.0.0-00010101000000-000000000000
	github.com/maypok86/otter/v2 v2.4.0
	github.com/viccon/sturdyc v1.1.5
	go.uber.org/goleak v1.3.0
	golang.org/x/perf v0.0.0-20260908200009-22c9c6c9d4da
	golang.org/x/sync v0.25.0
	resenje.org/singleflight v0.4.3
)

require (
	github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/flightcache/flightcache => ../
