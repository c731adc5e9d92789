package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
)

// Part d: freshness from the data. Tokens state their own expiry, and a
// cache with one TTL for all of them either serves some past it or throws
// the long-lived ones away early; Options.Freshness gives each its own.
// Then a catalogue whose entries rarely change: reloading them in full
// transfers every body again, while Options.Reload with ErrNotModified (an
// If-None-Match and a 304) transfers only what changed.

// tokenRow is one configuration of the token run.
type tokenRow struct {
	Config     string        `json:"config"`
	Gets       int64         `json:"gets"`
	Issued     int64         `json:"issued"`  // tokens the issuer made: downstream calls
	Expired    int64         `json:"expired"` // Gets that returned a token past its stated expiry
	MaxOverrun time.Duration `json:"max_overrun_ns"`
}

// catalogRow is one configuration of the catalogue run.
type catalogRow struct {
	Config      string `json:"config"`
	Gets        int64  `json:"gets"`
	Calls       int64  `json:"calls"`        // downstream requests
	NotModified int64  `json:"not_modified"` // of those, answered 304 (no body)
	Bytes       int64  `json:"bytes"`        // body bytes transferred
}

// freshnessResult is part d.
type freshnessResult struct {
	Duration time.Duration `json:"duration_ns"`
	Tokens   []tokenRow    `json:"tokens"`
	Catalog  []catalogRow  `json:"catalog"`
}

type token struct {
	id      int64
	expires time.Time
}

// issuer makes tokens that live between 100 and 400 ms.
type issuer struct{ issued atomic.Int64 }

func (s *issuer) load(ctx context.Context, user string) (token, error) {
	n := s.issued.Add(1)
	life := 100*time.Millisecond + rand.N(300*time.Millisecond)
	return token{id: n, expires: time.Now().Add(life)}, nil
}

// catalog is a downstream of 64 KiB entries whose versions change once in
// every 10 requests for them, on average; it answers If-None-Match (the
// version the caller holds) with a 304 and no body.
type catalog struct {
	calls, notModified, bytes atomic.Int64
	mu                        sync.Mutex
	versions                  map[string]int
}

const catalogBody = 64 << 10

type catalogEntry struct {
	version int
	body    []byte
}

func (c *catalog) fetch(key string, held int) (catalogEntry, bool) {
	c.calls.Add(1)
	c.mu.Lock()
	if rand.IntN(10) == 0 {
		c.versions[key]++
	}
	v := c.versions[key]
	c.mu.Unlock()
	if held == v {
		c.notModified.Add(1)
		return catalogEntry{}, false
	}
	c.bytes.Add(catalogBody)
	return catalogEntry{version: v, body: make([]byte, catalogBody)}, true
}

func (c *catalog) load(ctx context.Context, key string) (catalogEntry, error) {
	e, _ := c.fetch(key, -1)
	return e, nil
}

func (c *catalog) reload(ctx context.Context, key string, old catalogEntry) (catalogEntry, error) {
	e, changed := c.fetch(key, old.version)
	if !changed {
		return old, flightcache.ErrNotModified
	}
	return e, nil
}

func runFreshness(cfg config, p *progress) (*freshnessResult, error) {
	cfg.duration /= 2 // four runs
	res := &freshnessResult{Duration: cfg.duration}
	users := []string{"ann", "bob", "cyd"}

	// Tokens: one TTL for all, then each token's own.
	for _, c := range []struct {
		name  string
		fresh func(string, token) flightcache.Freshness
	}{
		{"one TTL (250 ms) for every token", nil},
		{"Freshness: each token's own expiry", func(_ string, t token) flightcache.Freshness {
			return flightcache.Freshness{TTL: time.Until(t.expires)}
		}},
	} {
		s := &issuer{}
		l, err := flightcache.New(s.load, flightcache.Options[string, token]{TTL: 250 * time.Millisecond, Freshness: c.fresh})
		if err != nil {
			return nil, err
		}
		row := tokenRow{Config: c.name}
		var mu sync.Mutex
		stop := p.start("d. tokens: "+c.name, cfg.duration, l.Stats)
		readFor(cfg, func(r int) {
			t, err := l.Get(context.Background(), users[r%len(users)])
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			row.Gets++
			if err == nil && now.After(t.expires) {
				row.Expired++
				row.MaxOverrun = max(row.MaxOverrun, now.Sub(t.expires))
			}
		})
		stop()
		l.Close()
		row.Issued = s.issued.Load()
		res.Tokens = append(res.Tokens, row)
	}

	// The catalogue: full reloads, then revalidation.
	keys := []string{"shoes", "hats", "coats", "bags"}
	for _, reload := range []bool{false, true} {
		c := &catalog{versions: map[string]int{}}
		opts := flightcache.Options[string, catalogEntry]{TTL: 50 * time.Millisecond, StaleWhileRevalidate: time.Second}
		name := "full reload on expiry"
		if reload {
			opts.Reload = c.reload
			name = "Reload with ErrNotModified (304)"
		}
		l, err := flightcache.New(c.load, opts)
		if err != nil {
			return nil, err
		}
		var gets atomic.Int64
		stop := p.start("d. catalogue: "+name, cfg.duration, l.Stats)
		readFor(cfg, func(r int) {
			l.Get(context.Background(), keys[r%len(keys)])
			gets.Add(1)
		})
		stop()
		l.Close()
		res.Catalog = append(res.Catalog, catalogRow{Config: name, Gets: gets.Load(), Calls: c.calls.Load(),
			NotModified: c.notModified.Load(), Bytes: c.bytes.Load()})
	}
	return res, nil
}

// readFor runs cfg.readers readers, each calling get with its number and
// pausing cfg.think between calls, for cfg.duration.
func readFor(cfg config, get func(reader int)) {
	end := time.Now().Add(cfg.duration)
	var wg sync.WaitGroup
	for r := range cfg.readers {
		wg.Go(func() {
			for time.Now().Before(end) {
				get(r)
				time.Sleep(cfg.think)
			}
		})
	}
	wg.Wait()
}

func (r *freshnessResult) print(w io.Writer) {
	fmt.Fprintf(w, "d. freshness from the data, %v per run\n\n", r.Duration)
	fmt.Fprintln(w, "  tokens that live 100-400 ms, read by 3 users:")
	var rows [][]string
	for _, t := range r.Tokens {
		rows = append(rows, []string{t.Config, fmt.Sprint(t.Gets), fmt.Sprint(t.Issued), fmt.Sprint(t.Expired), ms(t.MaxOverrun)})
	}
	table(w, "l", []string{"cache", "Gets", "tokens issued", "expired tokens served", "worst overrun"}, rows)
	fmt.Fprintln(w, "\n  a catalogue of 64 KiB entries, TTL 50 ms, one change in ten requests:")
	rows = nil
	for _, c := range r.Catalog {
		rows = append(rows, []string{c.Config, fmt.Sprint(c.Gets), fmt.Sprint(c.Calls), fmt.Sprint(c.NotModified),
			fmt.Sprintf("%.1f MiB", float64(c.Bytes)/(1<<20))})
	}
	table(w, "l", []string{"reload", "Gets", "downstream calls", "304s", "bodies transferred"}, rows)
}
