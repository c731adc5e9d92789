// Package bench measures flightcache beside the libraries a user would pick
// instead (raw ristretto, a locked map, otter, sturdyc, x/sync and resenje
// singleflight), in one `go test -bench` run, so that every comparison is a
// ratio taken on the same machine at the same moment.
//
// The package has no API: everything is in its _test.go files. See
// README.md for the commands, and cmd/report for the generator of
// docs/benchmarks.md.
package bench
