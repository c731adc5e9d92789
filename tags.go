package flightcache

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/flightcache/flightcache/remote"
)

// Tags (Options.Tags, Loader.InvalidateTag; docs/design.md rules 36 to
// 38). A tag is a name some values share (a category, a tenant, a role):
// InvalidateTag drops every value that carries it, in constant time, as
// InvalidateAll's floor does for all of them, but per tag.
//
// The Loader keeps a clock, moved by one by each InvalidateTag, and for
// each tag a state: the clock value of the tag's last invalidation
// (dropped). A tagged value is stamped with the clock when it is stored (a
// load's fill: when the load started, the data it read is of then) and
// holds its tags' states, resolved once as it is stored; it is absent once
// any of its tags was invalidated after its stamp (tagList.dropped). A hit
// pays one atomic load and a compare per tag; InvalidateTag locks one
// part of the tag table, for one map look-up, and scans nothing.
//
// A tag's state lives as long as a value holds it: the table keeps it
// through a weak pointer, and forgets it once it is collected. A state
// made afresh cannot know the invalidations of its tag before it (made by
// no one, or forgotten), so it starts at its part's floor: the latest
// such invalidation of any tag of the part. A load that spans one may so
// be refused its fill, never served a value it should not be.

// MaxTags is the most tags one value may carry ([Options.Tags]). A value
// given more is not cached: see [ErrTooManyTags].
const MaxTags = 8

// ErrTooManyTags is why a value whose [Options.Tags] gave more than
// [MaxTags] tags was not cached: never a silent cut to the first eight. A
// load's callers still get the value; a Set drops the value held for the
// key; both count in Stats.TagErrors. [Loader.Restore] returns it (wrapped,
// naming the entry) for an [Entry] with more.
var ErrTooManyTags = fmt.Errorf("flightcache: more than MaxTags (%d) tags for one value", MaxTags)

// tagParts is the number of independent parts of the tag table.
const tagParts = 64

// tagTable is the Loader's tags: the clock and each tag's state.
type tagTable struct {
	clock atomic.Uint64 // InvalidateTag calls so far: each takes the next value
	seed  maphash.Seed
	parts [tagParts]tagPart
}

// tagPart is one part of the tag table, chosen by the tag's hash.
type tagPart struct {
	mu sync.Mutex
	// states maps a tag to its state, weakly: a state no value holds is
	// collected, and its cleanup forgets it (forget).
	states map[string]weak.Pointer[tagState]
	// floor is where a state made afresh starts (guarded by mu): the
	// clock value of the latest invalidation of a tag of this part that
	// had no state, or of a state since forgotten (at most the clock when
	// it was).
	floor uint64
	_     [64 - 8 - 8 - 8]byte // keep neighbouring parts off one cache line
}

// tagState is one tag's: the clock value of its last invalidation. It
// holds its name too (Entries), which keeps it off the tiny allocator, so
// that it is collected (and its cleanup runs) once no value holds it.
type tagState struct {
	dropped atomic.Uint64
	name    string
}

// tagList is a tagged value's tags: their states, and the clock value the
// value was stamped with as it was stored. Immutable once built. It is
// allocated with room for its states right behind it (newTagList), so
// that states points into the same object: a hit's check reads the stamp
// and the pointers from one place, then one state per tag.
type tagList struct {
	stamp  uint64
	states []*tagState
}

// newTagList returns an empty tagList stamped at stamp, with states of
// length n (1 to MaxTags) held in the same allocation, of 32 bytes and
// room for 1, 2, 4 or 8 pointers: 48 bytes for one or two tags, 64 for
// three or four, 96 up to eight.
func newTagList(stamp uint64, n int) *tagList {
	switch {
	case n <= 1:
		b := &struct {
			tagList
			room [1]*tagState
		}{tagList: tagList{stamp: stamp}}
		b.states = b.room[:n]
		return &b.tagList
	case n <= 2:
		b := &struct {
			tagList
			room [2]*tagState
		}{tagList: tagList{stamp: stamp}}
		b.states = b.room[:n]
		return &b.tagList
	case n <= 4:
		b := &struct {
			tagList
			room [4]*tagState
		}{tagList: tagList{stamp: stamp}}
		b.states = b.room[:n]
		return &b.tagList
	}
	b := &struct {
		tagList
		room [MaxTags]*tagState
	}{tagList: tagList{stamp: stamp}}
	b.states = b.room[:n]
	return &b.tagList
}

// dropped reports whether any of t's tags was invalidated after t's stamp:
// the value is absent (rules 36 and 37).
func (t *tagList) dropped() bool {
	for _, s := range t.states {
		if s.dropped.Load() > t.stamp {
			return true
		}
	}
	return false
}

// droppedFor reports whether t (nil: no tags) was dropped since it was
// stamped and the clock moved before the Get stamped at was asked: a
// Get that started after such an invalidation does not take the value
// of a load that started before it (rule 37); it loads again.
func (t *tagList) droppedFor(at uint64) bool {
	return t != nil && at > t.stamp && t.dropped()
}

// names returns t's tags.
func (t *tagList) names() []string {
	if t == nil {
		return nil
	}
	out := make([]string, len(t.states))
	for i, s := range t.states {
		out[i] = s.name
	}
	return out
}

// newTagTable returns the table of a Loader with Options.Tags (nil
// without: every method below is then free).
func newTagTable(on bool) *tagTable {
	if !on {
		return nil
	}
	t := &tagTable{seed: maphash.MakeSeed()}
	for i := range t.parts {
		t.parts[i].states = make(map[string]weak.Pointer[tagState])
	}
	return t
}

// now is the clock (0 without tags).
func (t *tagTable) now() uint64 {
	if t == nil {
		return 0
	}
	return t.clock.Load()
}

func (t *tagTable) part(tag string) *tagPart {
	return &t.parts[maphash.String(t.seed, tag)%tagParts]
}

// invalidate records an invalidation of tag, in constant time: no scan,
// one part lock for one look-up, no allocation.
func (t *tagTable) invalidate(tag string) {
	tp := t.part(tag)
	tp.mu.Lock()
	n := t.clock.Add(1)
	if s := tp.states[tag].Value(); s != nil {
		s.dropped.Store(n)
	} else {
		tp.floor = n // no value holds it; a load in flight may: its state will start here
	}
	tp.mu.Unlock()
}

// state returns tag's state, made if it has none.
func (t *tagTable) state(tag string) *tagState {
	tp := t.part(tag)
	tp.mu.Lock()
	defer tp.mu.Unlock()
	wp, known := tp.states[tag]
	if s := wp.Value(); s != nil {
		return s
	}
	start := tp.floor
	if known {
		// Collected, not yet forgotten: its invalidations are lost with
		// it, and may be as late as now.
		start = max(start, t.clock.Load())
	}
	s := &tagState{name: strings.Clone(tag)}
	s.dropped.Store(start)
	tp.states[s.name] = weak.Make(s)
	runtime.AddCleanup(s, tp.forget, tagForget{t: t, name: s.name})
	return s
}

// tagForget is what a tag state's cleanup needs.
type tagForget struct {
	t    *tagTable
	name string
}

// forget runs once f's tag state is collected: the tag leaves the table,
// unless a new state took its place, and the part's floor rises to the
// clock, past any invalidation the state recorded.
func (tp *tagPart) forget(f tagForget) {
	tp.mu.Lock()
	if wp, ok := tp.states[f.name]; ok && wp.Value() == nil {
		delete(tp.states, f.name)
	}
	tp.floor = max(tp.floor, f.t.clock.Load())
	tp.mu.Unlock()
}

// len returns how many tags the table holds (for tests).
func (t *tagTable) len() int {
	n := 0
	for i := range t.parts {
		tp := &t.parts[i]
		tp.mu.Lock()
		n += len(tp.states)
		tp.mu.Unlock()
	}
	return n
}

// list resolves tags into a tagList stamped at stamp; nil for no tags.
func (t *tagTable) list(tags []string, stamp uint64) (*tagList, error) {
	if len(tags) > MaxTags {
		return nil, ErrTooManyTags
	}
	if len(tags) == 0 {
		return nil, nil
	}
	tl := newTagList(stamp, len(tags))
	for i, tag := range tags {
		tl.states[i] = t.state(tag)
	}
	return tl, nil
}

// tagsOf asks Options.Tags (user code, through the guard) for the tags of
// key's value v, stamped at stamp, and puts them in life. keep is false
// for a value not to be cached: Tags panicked or gave more than MaxTags
// (counted in Stats.TagErrors), or one of its tags was invalidated since
// stamp (rule 37). A cached not-found asks with v the zero V (rule 38).
func (l *Loader[K, V]) tagsOf(life *lifetime, key K, v V, stamp uint64, onGoexit func()) (keep bool) {
	if l.tags == nil {
		return true
	}
	var tags []string
	if l.user.guard(func() { tags = l.opts.Tags(key, v) }, onGoexit) != nil {
		l.stats.tagErrors.Add(1)
		return false
	}
	tl, err := l.tags.list(tags, stamp)
	if err != nil {
		l.stats.tagErrors.Add(1)
		return false
	}
	life.tags = tl
	return tl == nil || !tl.dropped()
}

// tagDropped reports whether e carries a tag invalidated since it was
// stored: it is absent (rule 36). One nil check for an untagged value.
func (e *entry[K, V]) tagDropped() bool {
	return e.extra != nil && e.extra.tags != nil && e.extra.tags.dropped()
}

// tagNames returns e's tags, for Entries.
func (e *entry[K, V]) tagNames() []string {
	if e.extra == nil {
		return nil
	}
	return e.extra.tags.names()
}

// InvalidateTag drops every value that carries tag ([Options.Tags]), in
// constant time: no scan, no lock held across keys, no allocation. Its
// rules are [Loader.Invalidate]'s: nothing with the tag stored before the
// call answers a Get, GetMany, Peek or Refresh that starts after it, and a
// load in flight whose value carries it fills nothing (docs/design.md rules
// 36 to 38). It counts in Stats.TagInvalidations; without Options.Tags, and
// after Close, it does nothing. It is safe for concurrent use.
//
// With a Remote that takes part ([remote.TagInvalidator], as the Redis
// tier does), the call drops the shared tier's entries that carry the tag
// too, and the other processes drop their copies when they hear of it
// (rule 42); with another Remote it acts on this Loader alone, and a load
// after the call may be answered from an entry stored there before it.
func (l *Loader[K, V]) InvalidateTag(tag string) {
	if l.tags == nil || l.gate.Closed() {
		return
	}
	// The Remote first, as for InvalidateAll, so that a load of this
	// process that races the call either read the tier before it (and its
	// value is dropped with the rest) or reads it afterwards.
	if r, ok := l.opts.Remote.(remote.TagInvalidator); ok {
		l.user.guard(func() { r.InvalidateTag(l.ctx, tag) }, nil)
	}
	local[K, V]{l}.dropTag(tag, false)
}

// DropTag implements [remote.TagDropper]: InvalidateTag without the
// Remote, for a tag another process invalidated (docs/design.md rule 42).
// It counts in Stats.TagInvalidations.
func (x local[K, V]) DropTag(tag string) {
	if x.l.tags == nil || x.l.gate.Closed() {
		return
	}
	x.dropTag(tag, true)
}

// dropTag drops the tag's values here, counts and reports it.
func (x local[K, V]) dropTag(tag string, fromFleet bool) {
	l := x.l
	l.tags.invalidate(tag)
	l.stats.tagInvalidations.Add(1)
	observeTag[K](l.opts.Observer, l.user.guard, TagEvent{Tag: tag, Remote: fromFleet})
}

var _ remote.TagDropper = local[string, int]{}

// checkTags reports an Entry's tags Restore cannot take.
func checkTags(tags []string) error {
	if len(tags) > MaxTags {
		return fmt.Errorf("Entry.Tags has %d tags: %w", len(tags), ErrTooManyTags)
	}
	return nil
}

// restoredTags resolves a restored Entry's tags (checked already: at most
// MaxTags), stamped now. A Loader without Options.Tags keeps none.
func (l *Loader[K, V]) restoredTags(tags []string) *tagList {
	if l.tags == nil {
		return nil
	}
	tl, _ := l.tags.list(tags, l.tags.now())
	return tl
}

// TagObserver is an optional capability of an [Observer]: it sees every
// tag invalidation, whether [Loader.InvalidateTag] was called here or the
// Remote heard of another process's call. TagInvalidated is called on the
// goroutine that invalidated the tag, once the tag is invalidated, through
// the guard every callback goes through.
type TagObserver interface {
	TagInvalidated(ev TagEvent)
}

// TagEvent describes one tag invalidation, for [TagObserver].
type TagEvent struct {
	// Tag is the tag invalidated.
	Tag string
	// Remote is true when another process of the fleet invalidated it
	// and the Remote passed it on ([remote.TagDropper]); false for this
	// Loader's own InvalidateTag.
	Remote bool
}

// TagInvalidated calls the TagInvalidated of each member that is a
// TagObserver.
func (f *fanout[K]) TagInvalidated(ev TagEvent) { f.tagInvalidated(unguarded, ev) }

func (f *fanout[K]) tagInvalidated(g guardFunc, ev TagEvent) {
	for _, m := range f.members {
		if to, ok := m.o.(TagObserver); ok {
			g(func() { to.TagInvalidated(ev) }, nil)
		}
	}
}

// observeTag reports a tag invalidation to o, if it sees them, through
// guard.
func observeTag[K comparable](o Observer[K], guard guardFunc, ev TagEvent) {
	switch o := o.(type) {
	case nil:
	case *fanout[K]:
		o.tagInvalidated(guard, ev)
	case TagObserver:
		guard(func() { o.TagInvalidated(ev) }, nil)
	}
}
