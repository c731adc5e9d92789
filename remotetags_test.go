package flightcache

import (
	"context"
	"sync"
	"testing"
)

// tagRemote is a watchingRemote that takes part in InvalidateTag, as a
// shared tier does.
type tagRemote struct {
	watchingRemote
	tags []string
}

func (r *tagRemote) InvalidateTag(_ context.Context, tag string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tags = append(r.tags, tag)
}

// tagEvents is an Observer that records the tag invalidations it sees.
type tagEvents struct {
	quietObserver
	mu  sync.Mutex
	evs []TagEvent
}

func (o *tagEvents) TagInvalidated(ev TagEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evs = append(o.evs, ev)
}

func (o *tagEvents) seen() []TagEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]TagEvent(nil), o.evs...)
}

// quietObserver is an Observer that does nothing.
type quietObserver struct{}

func (quietObserver) LoadStart(ctx context.Context, _ LoadStartEvent[string]) context.Context {
	return ctx
}
func (quietObserver) LoadEnd(context.Context, LoadEvent[string]) {}
func (quietObserver) Waited(context.Context, WaitEvent[string])  {}

// docs/design.md rule 42: InvalidateTag reaches a Remote that takes part
// (before the Loader drops its own copies), and the Observer sees it.
func TestInvalidateTagReachesTheRemote(t *testing.T) {
	d := &downstream{}
	r := &tagRemote{}
	obs := &tagEvents{}
	l := newLoader(t, d, Options[string, string]{Tags: byFirst, Remote: r, Observer: obs})
	ctx := context.Background()
	if _, err := l.Get(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	l.InvalidateTag("cat:a")
	r.mu.Lock()
	got := append([]string(nil), r.tags...)
	r.mu.Unlock()
	if len(got) != 1 || got[0] != "cat:a" {
		t.Fatalf("the Remote's InvalidateTag calls = %q, want [cat:a]", got)
	}
	if evs := obs.seen(); len(evs) != 1 || evs[0] != (TagEvent{Tag: "cat:a"}) {
		t.Fatalf("TagInvalidated events = %+v, want one for cat:a, not Remote", evs)
	}
	if _, info, _ := l.GetInfo(ctx, "a1"); info.Source != SourceLoaded {
		t.Fatalf("Get after InvalidateTag: %v, want a load", info.Source)
	}
}

// docs/design.md rule 42: a Remote drops a tag another process
// invalidated through the LocalCache (remote.TagDropper): every copy with
// the tag goes, and a load in flight whose value carries it answers its
// callers but fills nothing; other tags stay; the Remote is not told.
func TestRemoteDropTagForgetsTaggedCopies(t *testing.T) {
	d := &downstream{}
	obs := &tagEvents{}
	r := &tagRemote{}
	l := newLoader(t, d, Options[string, string]{Tags: byFirst, Remote: r, Observer: Observers[string](obs, quietObserver{})})
	ctx := context.Background()
	for _, k := range []string{"a1", "a2", "b1"} {
		if _, err := l.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	dt, ok := r.the().(interface{ DropTag(string) })
	if !ok {
		t.Fatalf("the LocalCache handed to Watch (%T) has no DropTag", r.the())
	}
	dt.DropTag("cat:a")
	for k, want := range map[string]Source{"a1": SourceLoaded, "a2": SourceLoaded, "b1": SourceHit} {
		if _, info, err := l.GetInfo(ctx, k); err != nil || info.Source != want {
			t.Fatalf("Get(%s) after DropTag: %v, %v; want %v", k, info.Source, err, want)
		}
	}
	if len(r.tags) != 0 {
		t.Fatalf("DropTag told the Remote: %q", r.tags)
	}
	if s := l.Stats(); s.TagInvalidations != 1 {
		t.Fatalf("TagInvalidations = %d, want 1", s.TagInvalidations)
	}
	if evs := obs.seen(); len(evs) != 1 || evs[0] != (TagEvent{Tag: "cat:a", Remote: true}) {
		t.Fatalf("TagInvalidated events = %+v, want one for cat:a, Remote", evs)
	}
	l.Close()
	dt.DropTag("cat:b") // after Close: nothing
	if s := l.Stats(); s.TagInvalidations != 1 {
		t.Fatalf("TagInvalidations after a DropTag past Close = %d, want 1", s.TagInvalidations)
	}
}
