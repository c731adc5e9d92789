module github.com/flightcache/flightcache

go 1.26

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/dgraph-io/ristretto/v2 v2.4.2
	github.com/sony/gobreaker/v2 v2.4.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	golang.org/x/sys v0.36.0 // indirect
)
