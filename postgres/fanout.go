package flightpg

import (
	"sync"
	"sync/atomic"
)

// fanOut bounds the Invalidate and InvalidateTag calls a flush has in
// flight at once. With the Redis tier each is a round trip to Redis
// (milliseconds under load); one at a time, a Source applied about 250
// single-row transactions a second.
const fanOut = 16

// invalidateKeys invalidates the group's keys and tags, at most fanOut
// at a time, and returns once every call has returned; a call that
// panicked does not stop the others, and the first panic is returned (a
// *flightcache.PanicError). Target.Invalidate and InvalidateTag are safe
// for concurrent use (a Loader's are, and its Redis tier's).
func (a *applier[K]) invalidateKeys() error {
	a.batch = a.batch[:0]
	a.vers = a.vers[:0]
	for k, v := range a.keys {
		a.batch = append(a.batch, k)
		a.vers = append(a.vers, v)
	}
	tags := make([]string, 0, len(a.tagSet))
	for t := range a.tagSet {
		tags = append(tags, t)
	}
	keys := a.batch
	n := len(keys) + len(tags)
	call := func(i int) error {
		if i < len(keys) {
			if v := a.vers[i]; v > 0 && a.tombstones != nil {
				a.stats.versioned.Add(1)
				return guard(func() { a.tombstones.InvalidateVersion(keys[i], v) })
			}
			return guard(func() { a.target.Invalidate(keys[i]) })
		}
		return guard(func() { a.tags.InvalidateTag(tags[i-len(keys)]) })
	}
	defer func() { clear(a.batch) }() // hold no key past the flush
	if n == 1 {
		return call(0)
	}
	var (
		next  atomic.Int64
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	work := func() {
		defer wg.Done()
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			if err := call(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}
	}
	workers := min(fanOut, n)
	wg.Add(workers)
	for range workers - 1 {
		go work()
	}
	work() // the Source's goroutine is one of them
	wg.Wait()
	return first
}
