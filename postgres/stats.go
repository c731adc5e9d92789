package flightpg

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stats says what a [Source] did since [New]: cumulative counters, the
// log positions it reached, and the lag of its recent transactions.
type Stats struct {
	// Transactions counts the committed transactions applied that held at
	// least one change of the publication.
	Transactions uint64
	// Changes counts the row changes read: one per row inserted, updated
	// or deleted, one per table truncated.
	Changes uint64
	// Invalidations counts the Invalidate calls made (InvalidateVersion
	// ones included): one per key per transaction part (a key named by
	// several changes of a transaction is invalidated once; see
	// Options.MaxPendingKeys).
	Invalidations uint64
	// Versioned counts those of the Invalidations that were
	// InvalidateVersion calls, with the version [Options.Version] gave.
	Versioned uint64
	// TagInvalidations counts the InvalidateTag calls made, likewise.
	TagInvalidations uint64
	// InvalidateAlls counts the InvalidateAll calls made, for any of the
	// reasons counted below, a Gap, or a slot that was created (nothing
	// from before a slot exists can be checked against it).
	InvalidateAlls uint64
	// TagsWithoutTarget counts the transactions whose changes named tags
	// that the target cannot drop alone (it has no InvalidateTag): each
	// distrusted every value instead.
	TagsWithoutTarget uint64
	// TruncatesUnmapped counts the transactions that truncated a table the
	// Mapping named no key and no tag for: each distrusted every value.
	TruncatesUnmapped uint64
	// Panics counts the panics recovered from the Mapping and the target:
	// each distrusted every value.
	Panics uint64
	// DecodeErrors counts the changes that could not be decoded: each
	// distrusted every value.
	DecodeErrors uint64
	// Gaps counts the times changes were lost to the Source (see
	// [Options.OnGap]): each distrusted every value.
	Gaps uint64
	// Reconnects counts the replication connections made after a loss.
	Reconnects uint64
	// NotYetVisible counts the transactions that arrived before
	// PostgreSQL made them visible to other sessions: the Source waited
	// for each before applying it (see docs/postgres.md).
	NotYetVisible uint64
	// AppliedLSN is the log position up to which every change has been
	// applied (its invalidations made): the end of the last transaction
	// applied, or, while nothing is pending, the last position the server
	// reported. [Source.Wait] waits for it.
	AppliedLSN LSN
	// ConfirmedLSN is the last position reported to the server as applied
	// (the slot's confirmed_flush_lsn): never past AppliedLSN, and at most
	// about a second behind it.
	ConfirmedLSN LSN
	// Resumed is true when [Options.Resume] was set and the slot replayed
	// from it: nothing committed after the snapshot is lost, and the
	// restored entries are checked against every change (after
	// [Source.CatchUp], all of them are). False with Resume set means the
	// slot could not replay from it: the restored entries were distrusted
	// (InvalidateAll) and Gaps counts it.
	Resumed bool
	// Lag is the time from commit (the server's clock) to applied (this
	// process's clock) of the last transactions applied.
	Lag Lag
	// LagHistogram counts every transaction applied since New by that
	// same lag, in fixed buckets: what a metrics exporter publishes as a
	// cumulative histogram.
	LagHistogram LagHistogram
	// ObserverPanics counts the panics recovered from [Options.Observer]'s
	// methods (each reported to OnError; nothing else changes).
	ObserverPanics uint64
}

// LagHistogram counts transactions by their commit-to-applied lag:
// Counts[i] those whose lag was at most Bounds[i] and above Bounds[i-1];
// the last count, one more than Bounds has, those above every bound. Sum
// is the lags' total (negative lags, from clocks apart, count as 0).
type LagHistogram struct {
	Bounds []time.Duration
	Counts []uint64
	Sum    time.Duration
}

// lagBounds are LagHistogram's bucket bounds.
var lagBounds = [...]time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
}

// lagCounts is a LagHistogram as it runs.
type lagCounts struct {
	counts [len(lagBounds) + 1]atomic.Uint64
	sum    atomic.Int64
}

func (h *lagCounts) add(d time.Duration) {
	d = max(d, 0)
	i, _ := slices.BinarySearch(lagBounds[:], d) // the first bound >= d
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *lagCounts) snapshot() LagHistogram {
	out := LagHistogram{Bounds: slices.Clone(lagBounds[:]), Counts: make([]uint64, len(h.counts)), Sum: time.Duration(h.sum.Load())}
	for i := range h.counts {
		out.Counts[i] = h.counts[i].Load()
	}
	return out
}

// Lag describes the commit-to-applied time of the last [LagWindow]
// transactions applied. Its durations compare two clocks: the server's
// and this process's.
type Lag struct {
	// Samples is how many transactions the figures cover.
	Samples int
	// P50, P99 and Max are the median, the 99th percentile and the maximum.
	P50, P99, Max time.Duration
}

// LagWindow is how many of the last transactions [Stats.Lag] covers.
const LagWindow = 1024

// counters are a Source's Stats as they run: atomics, and the lag window
// under its own lock.
type counters struct {
	transactions, changes, invalidations, tagInvalidations atomic.Uint64
	invalidateAlls, tagsWithoutTarget, truncatesUnmapped   atomic.Uint64
	panics, decodeErrors, gaps, reconnects, notYetVisible  atomic.Uint64
	versioned, observerPanics                              atomic.Uint64
	lag                                                    lagWindow
	lagHist                                                lagCounts
}

// lagWindow keeps the last LagWindow lags, overwriting the oldest.
type lagWindow struct {
	mu   sync.Mutex // guards ring, next, n
	ring [LagWindow]time.Duration
	next int // where the next lag goes
	n    int // how many are held, up to LagWindow
}

func (w *lagWindow) add(d time.Duration) {
	w.mu.Lock()
	w.ring[w.next] = d
	w.next = (w.next + 1) % LagWindow
	w.n = min(w.n+1, LagWindow)
	w.mu.Unlock()
}

func (w *lagWindow) summary() Lag {
	w.mu.Lock()
	held := slices.Clone(w.ring[:w.n])
	w.mu.Unlock()
	if len(held) == 0 {
		return Lag{}
	}
	slices.Sort(held)
	at := func(q float64) time.Duration { return held[int(q*float64(len(held)-1)+0.5)] }
	return Lag{Samples: len(held), P50: at(0.50), P99: at(0.99), Max: held[len(held)-1]}
}

func (c *counters) snapshot() Stats {
	return Stats{
		Transactions:      c.transactions.Load(),
		Changes:           c.changes.Load(),
		Invalidations:     c.invalidations.Load(),
		Versioned:         c.versioned.Load(),
		TagInvalidations:  c.tagInvalidations.Load(),
		InvalidateAlls:    c.invalidateAlls.Load(),
		TagsWithoutTarget: c.tagsWithoutTarget.Load(),
		TruncatesUnmapped: c.truncatesUnmapped.Load(),
		Panics:            c.panics.Load(),
		DecodeErrors:      c.decodeErrors.Load(),
		Gaps:              c.gaps.Load(),
		Reconnects:        c.reconnects.Load(),
		NotYetVisible:     c.notYetVisible.Load(),
		Lag:               c.lag.summary(),
		LagHistogram:      c.lagHist.snapshot(),
		ObserverPanics:    c.observerPanics.Load(),
	}
}
