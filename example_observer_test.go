package flightcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// blastRadius is an Observer that prints every failed load with how many
// Gets it failed, and how long each of them waited.
type blastRadius struct {
	mu     sync.Mutex
	waited map[string][]time.Duration // by key, for the load running now
}

func (b *blastRadius) LoadStart(ctx context.Context, ev flightcache.LoadStartEvent[string]) context.Context {
	return nil // keep the load's context as it is
}

func (b *blastRadius) LoadEnd(ctx context.Context, ev flightcache.LoadEvent[string]) {
	if ev.Err != nil {
		fmt.Printf("load of %s failed %d callers: %v\n", ev.Key, ev.Callers, ev.Err)
	}
}

func (b *blastRadius) Waited(ctx context.Context, ev flightcache.WaitEvent[string]) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waited[ev.Key] = append(b.waited[ev.Key], ev.Info.Waited)
}

// An Observer sees each load once and each Get that waited on it, never a
// hit: here, ten Gets share one failed load.
func ExampleObserver() {
	errDown := errors.New("pricing service down")
	obs := &blastRadius{waited: map[string][]time.Duration{}}
	release := make(chan struct{})
	prices, err := flightcache.New(func(ctx context.Context, sku string) (int, error) {
		<-release
		return 0, errDown
	}, flightcache.Options[string, int]{TTL: time.Minute, Observer: obs})
	if err != nil {
		panic(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { prices.Get(ctx, "sku-1") })
	}
	for deadline := time.Now().Add(10 * time.Second); prices.Stats().Waiting < 10; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			panic(fmt.Sprintf("after 10s, %d of the 10 Gets wait on the load; want all 10", prices.Stats().Waiting))
		}
	}
	close(release)
	wg.Wait()
	prices.Close() // waits for LoadEnd

	obs.mu.Lock()
	fmt.Println(len(obs.waited["sku-1"]), "Gets waited")
	obs.mu.Unlock()
	// Output:
	// load of sku-1 failed 10 callers: pricing service down
	// 10 Gets waited
}

// tagger is an Observer that puts its name in the load's context, so the
// LoadFunc and its own calls can see it, as a tracer puts its span there.
type tagger string

type tagKey string

func (t tagger) LoadStart(ctx context.Context, ev flightcache.LoadStartEvent[string]) context.Context {
	return context.WithValue(ctx, tagKey(t), "set by "+string(t))
}

func (t tagger) LoadEnd(ctx context.Context, ev flightcache.LoadEvent[string]) {
	fmt.Printf("%s.LoadEnd: its own %q, %v for the other\n", t, ctx.Value(tagKey(t)), ctx.Value(tagKey(t.other())))
}

func (t tagger) Waited(ctx context.Context, ev flightcache.WaitEvent[string]) {}

func (t tagger) other() tagger {
	if t == "metrics" {
		return "traces"
	}
	return "metrics"
}

// Observers combines several Observers into one. The load's context holds
// the values of all of them, but each gets back the context it returned
// itself, so that one never takes another's span for its own.
func ExampleObservers() {
	obs := flightcache.Observers[string](tagger("metrics"), nil, tagger("traces"))

	// What a Loader does with it, by hand: LoadStart, then the LoadFunc
	// with the context it returned, then LoadEnd.
	ctx := obs.LoadStart(context.Background(), flightcache.LoadStartEvent[string]{Key: "sku-1", Keys: 1})
	fmt.Println("the LoadFunc sees:", ctx.Value(tagKey("metrics")), "and", ctx.Value(tagKey("traces")))
	obs.LoadEnd(ctx, flightcache.LoadEvent[string]{Key: "sku-1", Keys: 1})

	fmt.Println(flightcache.Observers[string]() == nil)
	// Output:
	// the LoadFunc sees: set by metrics and set by traces
	// metrics.LoadEnd: its own "set by metrics", <nil> for the other
	// traces.LoadEnd: its own "set by traces", set by metrics for the other
	// true
}
