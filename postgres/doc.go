// Package flightpg keeps a flightcache Loader true to the rows PostgreSQL
// commits, whoever wrote them: a [Source] reads a publication's changes
// from logical replication (the pgoutput plugin), asks the user's
// [Mapping] which keys (and tags) each change touches, and invalidates
// them in commit order. See docs/postgres.md for the server's setup and
// the guarantees.
package flightpg
