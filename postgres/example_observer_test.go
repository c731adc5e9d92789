package flightpg_test

import (
	"fmt"
	"sync"
	"time"

	flightpg "github.com/flightcache/flightcache/postgres"
)

// changeMetrics is an Observer that keeps what a metrics exporter
// publishes: changes applied, a lag histogram, gaps and reconnects, and,
// read at collection time, the confirmed position (a StatsObserver).
type changeMetrics struct {
	mu         sync.Mutex
	changes    int
	lags       []time.Duration // a histogram's samples (OpenTelemetry: Float64Histogram.Record)
	gaps       int
	reconnects int
	stats      func() flightpg.Stats
}

func (m *changeMetrics) Applied(a flightpg.Applied) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes += a.Changes
	m.lags = append(m.lags, a.Lag)
}

func (m *changeMetrics) Gap(flightpg.Gap) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gaps++
}

func (m *changeMetrics) Reconnected(flightpg.Reconnected) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reconnects++
}

func (m *changeMetrics) ObserveStats(stats func() flightpg.Stats) { m.stats = stats }

// An Observer is set in the Options; the Source calls it on its
// goroutine after each transaction applied, gap and reconnect. Here two
// transactions and a gap are handed to it as a Source would.
func ExampleObserver() {
	m := &changeMetrics{}
	_ = flightpg.Options{Publication: "products_pub", Observer: m} // flightpg.New(ctx, url, products, byID, opts)

	var obs flightpg.Observer = m
	obs.Applied(flightpg.Applied{Changes: 3, Keys: 3, Lag: 2 * time.Millisecond})
	obs.Applied(flightpg.Applied{Changes: 1, Keys: 1, Lag: 40 * time.Millisecond})
	obs.Gap(flightpg.Gap{Slot: "flightpg_1a2b", Reason: "the temporary slot went with its connection"})
	fmt.Println("changes", m.changes, "lags", m.lags, "gaps", m.gaps, "reconnects", m.reconnects)
	// Output: changes 4 lags [2ms 40ms] gaps 1 reconnects 0
}
