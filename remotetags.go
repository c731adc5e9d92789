package flightcache

import "github.com/flightcache/flightcache/remote"

// This file is the tier's side of tags (docs/design.md rule 42): how an
// InvalidateTag reaches a Remote that takes part ([remote.TagInvalidator]),
// how a Remote has this Loader drop a tag another process invalidated
// ([remote.TagDropper]), and the Observer's event for both
// ([TagObserver]).

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

// observeTag reports a tag invalidation to the Observer, if it sees them.
func (l *Loader[K, V]) observeTag(ev TagEvent) {
	switch o := l.opts.Observer.(type) {
	case nil:
	case *fanout[K]:
		o.tagInvalidated(l.user.guard, ev)
	case TagObserver:
		l.user.guard(func() { o.TagInvalidated(ev) }, nil)
	}
}

// remoteInvalidateTag tells the Remote, if it takes part, about an
// InvalidateTag: before the Loader drops its own copies, as for
// InvalidateAll, so that a load of this process that races the call
// either read the tier before it (and its value is dropped with the rest)
// or reads it afterwards.
func (l *Loader[K, V]) remoteInvalidateTag(tag string) {
	if r, ok := l.opts.Remote.(remote.TagInvalidator); ok {
		l.user.guard(func() { r.InvalidateTag(l.ctx, tag) }, nil)
	}
}

// DropTag implements [remote.TagDropper]: InvalidateTag without the
// Remote, for a tag another process invalidated. It counts in
// Stats.TagInvalidations.
func (x local[K, V]) DropTag(tag string) {
	l := x.l
	if l.tags == nil || l.gate.Closed() {
		return
	}
	l.tags.invalidate(tag)
	l.stats.tagInvalidations.Add(1)
	l.observeTag(TagEvent{Tag: tag, Remote: true})
}

var _ remote.TagDropper = local[string, int]{}
