package otelflightcache

import (
	"context"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// The tag counters: Stats.TagInvalidations and Stats.TagErrors read at
// collection time, and the TagObserver events that came from the fleet
// (a Remote passed another process's InvalidateTag on) counted apart; a
// real Loader reports its own InvalidateTag calls through both.
func TestTagInvalidationsAreCounted(t *testing.T) {
	r := newRig(t)
	var obs any = r.obs
	to, ok := obs.(flightcache.TagObserver)
	if !ok {
		t.Fatalf("the Observer is not a flightcache.TagObserver")
	}
	to.TagInvalidated(flightcache.TagEvent{Tag: "a", Remote: true})
	to.TagInvalidated(flightcache.TagEvent{Tag: "b", Remote: true})
	to.TagInvalidated(flightcache.TagEvent{Tag: "c"})
	r.obs.ObserveStats(func() flightcache.Stats { return flightcache.Stats{TagInvalidations: 3, TagErrors: 4} })
	got := collect(t, r.reader)
	wantValue(t, got, `flightcache.tag.invalidations{flightcache.name=test}`, 3)
	wantValue(t, got, `flightcache.tag.invalidations.fleet{flightcache.name=test}`, 2)
	wantValue(t, got, `flightcache.tag.errors{flightcache.name=test}`, 4)

	// Through a Loader: one InvalidateTag, one value with too many tags.
	r = newRig(t)
	l, err := flightcache.New(func(_ context.Context, k string) (string, error) { return k, nil },
		flightcache.Options[string, string]{TTL: time.Hour, Observer: r.obs, Tags: func(k, _ string) []string {
			if k == "many" {
				return []string{"1", "2", "3", "4", "5", "6", "7", "8", "9"}
			}
			return []string{"t"}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, k := range []string{"a", "many"} {
		if _, err := l.Get(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	l.InvalidateTag("t")
	got = collect(t, r.reader)
	wantValue(t, got, `flightcache.tag.invalidations{flightcache.name=test}`, 1)
	wantValue(t, got, `flightcache.tag.invalidations.fleet{flightcache.name=test}`, 0)
	wantValue(t, got, `flightcache.tag.errors{flightcache.name=test}`, 1)
}
