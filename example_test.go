package flightcache_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/gob"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
)

type Product struct {
	ID    string
	Price int
}

// A Loader in front of a slow lookup: a hundred concurrent Gets of a cold
// key make one downstream call.
func Example() {
	var calls atomic.Int32
	prices, err := flightcache.New(func(ctx context.Context, id string) (Product, error) {
		calls.Add(1)
		time.Sleep(50 * time.Millisecond) // the expensive downstream call
		return Product{ID: id, Price: 1299}, nil
	}, flightcache.Options[string, Product]{TTL: time.Minute})
	if err != nil {
		panic(err)
	}
	defer prices.Close()

	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if _, err := prices.Get(context.Background(), "p-1"); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	p, _ := prices.Get(context.Background(), "p-1")
	fmt.Println(p.Price, "from", calls.Load(), "downstream call")
	// Output: 1299 from 1 downstream call
}

// GetInfo says where each value came from: the caller that started a load,
// the callers that shared it, and the hits after it.
func ExampleLoader_GetInfo() {
	release := make(chan struct{})
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		<-release
		return "value of " + id, nil
	}, flightcache.Options[string, string]{TTL: time.Minute})
	defer l.Close()

	ctx := context.Background()
	first := make(chan flightcache.Info)
	go func() { _, info, _ := l.GetInfo(ctx, "k"); first <- info }()
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().Waiting == 0 { // wait until the first Get has started the load
		if time.Now().After(deadline) {
			panic("the first Get did not start the load within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	second := make(chan flightcache.Info)
	go func() { _, info, _ := l.GetInfo(ctx, "k"); second <- info }()
	for l.Stats().Waiting < 2 {
		if time.Now().After(deadline) {
			panic("the second Get did not join the load within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	fmt.Println((<-first).Source, (<-second).Source)
	_, info, _ := l.GetInfo(ctx, "k")
	fmt.Println(info.Source)
	// Output:
	// loaded shared
	// hit
}

// Under CancelAtZero a load is cancelled when its last caller leaves; under
// FinishAndFill (the default) it finishes and fills the cache.
func ExamplePolicy() {
	for _, policy := range []flightcache.Policy{flightcache.FinishAndFill, flightcache.CancelAtZero} {
		started := make(chan struct{})
		finished := make(chan error, 1)
		l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
			close(started)
			select {
			case <-time.After(50 * time.Millisecond):
				finished <- nil
				return "loaded", nil
			case <-ctx.Done():
				finished <- context.Cause(ctx)
				return "", ctx.Err()
			}
		}, flightcache.Options[string, string]{TTL: time.Minute, Policy: policy})

		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-started; cancel() }() // the only caller gives up
		_, err := l.Get(ctx, "k")
		fmt.Printf("%s: caller got %v; load ended with %v\n", policy, err, <-finished)
		l.Close()
	}
	// Output:
	// finish-and-fill: caller got context canceled; load ended with <nil>
	// cancel-at-zero: caller got context canceled; load ended with flightcache: load abandoned by every caller: context canceled
}

// With StaleIfError a failing downstream does not reach callers while a
// stale value exists: they get the last good value instead of the error.
func ExampleOptions_staleIfError() {
	var down atomic.Bool
	l, _ := flightcache.New(func(ctx context.Context, id string) (int, error) {
		if down.Load() {
			return 0, errors.New("pricing service unavailable")
		}
		return 42, nil
	}, flightcache.Options[string, int]{TTL: 20 * time.Millisecond, StaleIfError: time.Hour})
	defer l.Close()

	ctx := context.Background()
	l.Get(ctx, "p-1")
	down.Store(true)
	time.Sleep(50 * time.Millisecond) // the value is stale now

	v, info, err := l.GetInfo(ctx, "p-1")
	fmt.Println(v, info.Source, err)
	fmt.Println("errors shared with callers:", l.Stats().SharedErrors)
	// Output:
	// 42 stale-on-error <nil>
	// errors shared with callers: 0
}

// WithMaxStale bounds how stale a value one Get accepts, like HTTP's
// Cache-Control: max-stale; 0 means no-cache.
func ExampleWithMaxStale() {
	var n atomic.Int32
	l, _ := flightcache.New(func(ctx context.Context, id string) (int32, error) {
		return n.Add(1), nil
	}, flightcache.Options[string, int32]{TTL: 20 * time.Millisecond, StaleWhileRevalidate: time.Hour})
	defer l.Close()

	ctx := context.Background()
	l.Get(ctx, "k")
	time.Sleep(50 * time.Millisecond)
	v, info, _ := l.GetInfo(flightcache.WithMaxStale(ctx, 0), "k")
	fmt.Println(v, info.Source)
	// Output: 2 loaded
}

// OnLoad reports every downstream load; Callers is the blast radius of a
// failed one.
func ExampleOptions_onLoad() {
	release := make(chan struct{})
	events := make(chan flightcache.LoadEvent[string], 1)
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		<-release
		return "", errors.New("query timeout")
	}, flightcache.Options[string, string]{
		TTL:    time.Minute,
		OnLoad: func(ev flightcache.LoadEvent[string]) { events <- ev },
	})
	defer l.Close()

	var wg sync.WaitGroup
	for range 7 {
		wg.Go(func() { l.Get(context.Background(), "user:1") })
	}
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Waiting < 7; { // every caller is queued behind the one load
		if time.Now().After(deadline) {
			panic("7 callers were not waiting for the load within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	ev := <-events
	fmt.Printf("load of %s failed (%v) and reached %d callers\n", ev.Key, ev.Err, ev.Callers)
	// Output: load of user:1 failed (query timeout) and reached 7 callers
}

// Shutdown stops the Loader like Close, but waits only as long as its
// context allows: here a load that ignores its context outlives the
// deadline, and a second Shutdown returns once the load has ended.
func ExampleLoader_Shutdown() {
	release := make(chan struct{})
	started := make(chan struct{})
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		close(started)
		<-release // a downstream call that ignores ctx
		return "v", nil
	}, flightcache.Options[string, string]{TTL: time.Minute})

	go l.Get(context.Background(), "k")
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	fmt.Println("first Shutdown:", l.Shutdown(ctx))
	_, err := l.Get(context.Background(), "other")
	fmt.Println("Get after it:", err)

	close(release)
	fmt.Println("second Shutdown:", l.Shutdown(context.Background()))
	// Output:
	// first Shutdown: context deadline exceeded
	// Get after it: flightcache: loader closed
	// second Shutdown: <nil>
}

// A LoadFunc that ends its goroutine with runtime.Goexit (as t.FailNow
// does) cannot return a value or an error; every caller of the load gets
// an error matching ErrGoexit instead, and nothing is cached.
func ExampleErrGoexit() {
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		runtime.Goexit()
		return "", nil
	}, flightcache.Options[string, string]{TTL: time.Minute})
	defer l.Close()

	_, err := l.Get(context.Background(), "k")
	fmt.Println(errors.Is(err, flightcache.ErrGoexit))
	// Output: true
}

// Freshness gives each value its own lifetime, here a token's stated
// expiry: it is never served past it, whatever the Options' TTL.
func ExampleOptions_freshness() {
	type token struct {
		value   string
		expires time.Time
	}
	issued := 0
	l, _ := flightcache.New(func(ctx context.Context, user string) (token, error) {
		issued++
		return token{value: fmt.Sprint("t", issued), expires: time.Now().Add(30 * time.Millisecond)}, nil
	}, flightcache.Options[string, token]{
		TTL: time.Hour,
		Freshness: func(user string, t token) flightcache.Freshness {
			return flightcache.Freshness{TTL: time.Until(t.expires)}
		},
	})
	defer l.Close()

	t1, _ := l.Get(context.Background(), "ann")
	t2, _ := l.Get(context.Background(), "ann")
	time.Sleep(40 * time.Millisecond)
	t3, _ := l.Get(context.Background(), "ann")
	fmt.Println(t1.value, t2.value, t3.value)
	// Output: t1 t1 t2
}

// Reload revalidates the value held, as If-None-Match does: a downstream
// that says nothing changed costs no new value, and the old one is renewed.
func ExampleOptions_reload() {
	version := "v1"
	events := make(chan flightcache.LoadEvent[string], 3)
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		return version, nil
	}, flightcache.Options[string, string]{
		TTL: 20 * time.Millisecond, StaleIfError: time.Hour,
		Reload: func(ctx context.Context, id string, old string) (string, error) {
			if old == version {
				return "", flightcache.ErrNotModified // HTTP 304
			}
			return version, nil
		},
		// OnLoad runs after the load's callers have their value, so the
		// example reads its events from a channel to print them in order.
		OnLoad: func(ev flightcache.LoadEvent[string]) { events <- ev },
	})
	defer l.Close()
	report := func(v string) {
		ev := <-events
		fmt.Printf("got %s (reload %v, not modified %v)\n", v, ev.Reload, ev.NotModified)
	}

	ctx := context.Background()
	v, _ := l.Get(ctx, "k")
	report(v)
	time.Sleep(30 * time.Millisecond)
	v, _ = l.Get(ctx, "k") // expired: revalidated, not changed
	report(v)
	version = "v2"
	v, _ = l.Get(flightcache.WithRevalidate(ctx), "k") // no-cache: revalidated now
	report(v)
	// Output:
	// got v1 (reload false, not modified false)
	// got v1 (reload true, not modified true)
	// got v2 (reload true, not modified false)
}

// Refresh reloads a key in the background while its current value keeps
// serving, for example after hearing that the downstream changed it.
func ExampleLoader_Refresh() {
	price := 100
	l, _ := flightcache.New(func(ctx context.Context, id string) (int, error) {
		return price, nil
	}, flightcache.Options[string, int]{TTL: time.Hour})
	defer l.Close()

	ctx := context.Background()
	v, _ := l.Get(ctx, "p1")
	fmt.Println(v)
	price = 120
	l.Refresh(ctx, "p1") // nobody waits for it
	for deadline := time.Now().Add(10 * time.Second); v == 100; {
		if time.Now().After(deadline) {
			panic("the refresh did not store the new price within 10s")
		}
		time.Sleep(time.Millisecond)
		v, _ = l.Get(ctx, "p1")
	}
	fmt.Println(v)
	// Output:
	// 100
	// 120
}

// GetMany answers a page of keys: the cached ones from the cache, the rest
// in one LoadMany call. A key the downstream does not know is absent.
func ExampleLoader_GetMany() {
	var calls atomic.Int32
	// No LoadFunc: a Get would load its one key through LoadMany.
	l, _ := flightcache.New(nil, flightcache.Options[string, int]{
		TTL: time.Minute,
		LoadMany: func(ctx context.Context, ids []string) (map[string]int, error) {
			calls.Add(1)
			prices := map[string]int{}
			for _, id := range ids {
				if id != "p-404" {
					prices[id] = 100 + len(prices)
				}
			}
			return prices, nil
		},
	})
	defer l.Close()
	l.Set("p-1", 42)

	ctx := context.Background()
	page, err := l.GetMany(ctx, []string{"p-1", "p-2", "p-3", "p-404", "p-2"})
	fmt.Println(len(page), page["p-1"], err)
	fmt.Println("LoadMany calls:", calls.Load(), "Gets:", l.Stats().Gets)
	// Output:
	// 3 42 <nil>
	// LoadMany calls: 1 Gets: 4
}

// With a BatchWindow, concurrent Gets of distinct cold keys (the N+1 of
// a page rendered by goroutines, each asking for its own row) wait up to
// the window and go out as one LoadMany call: here at once when the 20th
// key joins (MaxBatch), else a second after the first did.
func ExampleOptions_batchWindow() {
	var calls atomic.Int32
	l, _ := flightcache.New(nil, flightcache.Options[string, int]{
		TTL:         time.Minute,
		BatchWindow: time.Second,
		MaxBatch:    20,
		LoadMany: func(ctx context.Context, ids []string) (map[string]int, error) {
			calls.Add(1)
			prices := map[string]int{}
			for _, id := range ids {
				prices[id] = 100
			}
			return prices, nil
		},
	})
	defer l.Close()

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := l.Get(context.Background(), fmt.Sprintf("p-%d", i)); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("Gets: 20, LoadMany calls:", calls.Load())
	// Output:
	// Gets: 20, LoadMany calls: 1
}

// GetManyInfo says of each key what GetInfo would have: p-1 was cached,
// this call loaded p-2, and its load of p-404 answered not found (absent
// from the values, not an error).
func ExampleLoader_GetManyInfo() {
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		if id == "p-404" {
			return "", flightcache.ErrNotFound
		}
		return "name of " + id, nil
	}, flightcache.Options[string, string]{TTL: time.Minute})
	defer l.Close()
	l.Set("p-1", "Widget")

	ids := []string{"p-1", "p-2", "p-404"}
	vals, infos, err := l.GetManyInfo(context.Background(), ids)
	for _, id := range ids {
		v, ok := vals[id]
		fmt.Printf("%s: %s, %q %v\n", id, infos[id].Source, v, ok)
	}
	fmt.Println(err)
	// Output:
	// p-1: hit, "Widget" true
	// p-2: loaded, "name of p-2" true
	// p-404: loaded, "" false
	// <nil>
}

// The keys a batch could not load are in a ManyError; the map still holds
// the others.
func ExampleManyError() {
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		if id == "bad" {
			return "", errors.New("downstream: boom")
		}
		return "v-" + id, nil
	}, flightcache.Options[string, string]{TTL: time.Minute})
	defer l.Close()

	vals, err := l.GetMany(context.Background(), []string{"a", "bad"})
	var me *flightcache.ManyError[string]
	if errors.As(err, &me) {
		fmt.Println(vals["a"], "failed:", me.Errs["bad"])
	}
	// Output:
	// v-a failed: downstream: boom
}

// Peek reads what the Loader holds, fresh or stale, without loading.
func ExampleLoader_Peek() {
	l, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		return "loaded", nil
	}, flightcache.Options[string, string]{TTL: time.Minute})
	defer l.Close()

	_, _, ok := l.Peek("k")
	fmt.Println(ok)
	l.Get(context.Background(), "k")
	v, info, ok := l.Peek("k")
	fmt.Println(v, info.Source, ok, l.Stats().Peeks)
	// Output:
	// false
	// loaded hit true 2
}

// A LoadFunc that returns its database's own error for a missing row:
// IsNotFound says that sql.ErrNoRows means the key does not exist, so the
// missing row is not retried, is no breaker failure, and is cached for
// NotFoundTTL; callers see an error that matches both sql.ErrNoRows and
// flightcache.ErrNotFound, as every not-found does. Without IsNotFound it would
// be a failure, queried three times per Get. The LoadFunc could instead
// return fmt.Errorf("%w: %w", flightcache.ErrNotFound, err).
func ExampleOptions_isNotFound() {
	var queries atomic.Int32
	names, _ := flightcache.New(func(ctx context.Context, id string) (string, error) {
		queries.Add(1)
		if id != "p-1" {
			return "", sql.ErrNoRows // what Row.Scan returns for no row
		}
		return "Widget", nil
	}, flightcache.Options[string, string]{
		TTL:         time.Minute,
		NotFoundTTL: 10 * time.Second,
		Retry:       flightcache.Retry{MaxAttempts: 3},
		IsNotFound:  func(err error) bool { return errors.Is(err, sql.ErrNoRows) },
	})
	defer names.Close()

	for range 3 {
		_, err := names.Get(context.Background(), "p-404")
		fmt.Println(errors.Is(err, sql.ErrNoRows), errors.Is(err, flightcache.ErrNotFound))
	}
	fmt.Println("queries:", queries.Load())
	// Output:
	// true true
	// true true
	// true true
	// queries: 1
}

// Entries and Restore give a restarted process the values the last one
// held: save them at shutdown (here with encoding/gob, one entry at a
// time, into a buffer that stands for a file), restore them at start,
// before serving, and the first Gets are hits, each value with the
// freshness it had left, and no downstream call.
func ExampleLoader_Restore() {
	ctx := context.Background()
	var calls atomic.Int32
	load := func(ctx context.Context, id string) (string, error) {
		calls.Add(1)
		return "profile of " + id, nil
	}
	opts := flightcache.Options[string, string]{TTL: time.Hour}

	// The process before the restart serves, then saves at shutdown.
	before, _ := flightcache.New(load, opts)
	for _, id := range []string{"ann", "bob", "eve"} {
		before.Get(ctx, id)
	}
	var file bytes.Buffer
	enc := gob.NewEncoder(&file)
	for en := range before.Entries() {
		if err := enc.Encode(en); err != nil {
			panic(err)
		}
	}
	before.Shutdown(ctx)

	// The new process restores at start, reading the file as it goes.
	after, _ := flightcache.New(load, opts)
	defer after.Close()
	dec := gob.NewDecoder(&file)
	n, err := after.Restore(func(yield func(flightcache.Entry[string, string]) bool) {
		for {
			var en flightcache.Entry[string, string]
			if dec.Decode(&en) != nil { // io.EOF at the end
				return
			}
			if !yield(en) {
				return
			}
		}
	})
	fmt.Println("restored", n, err, "held", after.Len())
	v, info, _ := after.GetInfo(ctx, "bob")
	fmt.Printf("%s (%s), downstream calls since the restart: %d\n", v, info.Source, calls.Load()-3)
	// Output:
	// restored 3 <nil> held 3
	// profile of bob (hit), downstream calls since the restart: 0
}

// Account is a row with a version column the database moves on each write.
type Account struct {
	ID      string
	Balance int
	Version uint64
}

// With Options.Version, Set of the row a database write returned is safe:
// when two writers' Sets arrive in the other order than their writes, the
// older row is dropped instead of replacing the newer one, and a load from
// a lagging replica never puts an older row back either.
func ExampleOptions_version() {
	replica := Account{ID: "a-1", Balance: 100, Version: 1} // a replica, one write behind
	accounts, err := flightcache.New(func(ctx context.Context, id string) (Account, error) {
		return replica, nil
	}, flightcache.Options[string, Account]{
		TTL:     time.Minute,
		Version: func(a Account) uint64 { return a.Version },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer accounts.Close()

	// Two writers: the second write (version 3) answers first.
	accounts.Set("a-1", Account{ID: "a-1", Balance: 70, Version: 3})
	accounts.Set("a-1", Account{ID: "a-1", Balance: 50, Version: 2}) // older: dropped
	a, _ := accounts.Get(context.Background(), "a-1")
	fmt.Println("after both Sets:", a.Balance, "version", a.Version)

	// A revalidating Get reads the lagging replica: its caller gets what
	// it read, the cache keeps the newer row.
	r, _ := accounts.Get(flightcache.WithRevalidate(context.Background()), "a-1")
	a, _ = accounts.Get(context.Background(), "a-1")
	fmt.Println("the replica said:", r.Balance, "version", r.Version, "- cached:", a.Balance, "version", a.Version)
	fmt.Println("writes dropped as outdated:", accounts.Stats().WritesOutdated)
	// Output:
	// after both Sets: 70 version 3
	// the replica said: 100 version 1 - cached: 70 version 3
	// writes dropped as outdated: 2
}
