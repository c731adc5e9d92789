// Package remote is the contract between a flightcache Loader and a second
// tier shared by several processes (the Redis tier of the flightredis
// module, for one), as database/sql/driver is to database/sql: what such a
// tier implements ([Remote] and the optional [Many], [AllInvalidator],
// [TagInvalidator], [Attacher] and [Watcher]), the records it exchanges
// with the Loader ([Value], [Result], [Rules], [LocalCache], and the
// [TagDropper] a LocalCache is), the Loader's rule for a
// value's age ([Windows], [Bounds], [Phase]), what it reads from a Get's
// context ([MaxStale], [AcceptsStale]) and gives a load
// ([WithReloadValue]), the errors both sides match ([ErrNotFound] and the
// others), and the saturating sums it makes of lifetimes ([Add], [Mul],
// [Scale]).
//
// Whoever writes a tier imports this package. A user of a Loader should
// not need it: a tier is set in the Loader's Options.Remote, and the
// errors and context functions a caller uses are also flightcache's own
// names (the same values: flightcache.ErrNotFound is [ErrNotFound],
// flightcache.WithMaxStale is [WithMaxStale]).
//
// The package imports only the standard library (and flightcache's own
// time arithmetic): flightcache imports it, never the other way.
package remote
