package flightcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// The model-based fuzz test: a byte string is read as a sequence of
// operations (Gets with and without cancellation, revalidating Gets, Set,
// Invalidate, Refresh, GetMany through a LoadMany, Peek, InvalidateAll,
// time advancing)
// and downstream outcomes (success,
// failure, panic, not-found), with values that carry their own lifetimes
// (Options.Freshness: some live 1s with no stale-while-revalidate window,
// some are not to be cached at all),
// run in a synctest bubble against a small reference model of the rules of
// behaviour in docs/design.md. Every Get's value, error, Source and Age must
// match the model, and so must the downstream call count after every
// operation and the Stats at the end.
//
// The bytes are read in pairs (operation, argument). An input of odd length
// ends in a configuration byte: its lowest bit selects the Policy (0
// FinishAndFill, 1 CancelAtZero), and the next bits (byte/2 % 3) an
// Options.Limit (modelLimits: none, MaxLoads 1, or an adaptive bound held at
// 2). Inputs of even length run under FinishAndFill without a Limit.
//
// With a Limit (docs/design.md rule 22), the hold operation fills every
// downstream slot and the queue with loads of keys of their own, which wait
// until the next hold operation lets them go. While they hold, a load fails
// at once with ErrLimited (counted in Loads and Limited, no downstream
// call, covered by a stale value like any failure), a value within
// StaleIfError answers at once (SourceStaleLimited, no load), and a
// refresh is dropped (RefreshesLimited). A GetMany's background batch
// holds a slot of its own from its first stale key on, so with a bound of 1
// a later key within StaleIfError is answered stale-limited and its misses'
// batch waits its turn. Without a Limit the hold operation only keeps two
// unrelated loads running.
//
// A Get with a cancelled context that has to wait for a load may leave
// before the load ends (it gets context.Canceled) or find the result
// already there (the load goroutine ran first): which one is up to the
// scheduler. The model follows the branch the Get reports and is exact in
// both: under FinishAndFill the load fills the cache either way; under
// CancelAtZero a Get that left abandoned the load (it was the only waiter),
// so the downstream was called but nothing is stored, and a Get that took
// the result saw a load that finished and filled the cache as usual.

const (
	modelTTL      = 4 * time.Second
	modelSWR      = 2 * time.Second
	modelSIE      = 2 * time.Second
	modelNotFound = time.Second
)

type outcome uint8

const (
	succeed outcome = iota
	fail
	panics
	notFound
)

type modelEntry struct {
	val          string
	notFound     bool
	loadedAt     time.Duration
	refreshAfter time.Duration
	distrusted   bool // loaded before a Distrust (rule 18)
}

// covers reports whether e may cover a failed load of its key: a value
// within StaleIfError, or any value held when the load was a reread of
// a distrusted copy (as for a revalidating Get).
func (e *modelEntry) covers(now time.Duration) bool {
	if e == nil || e.notFound {
		return false
	}
	p := e.phase(now)
	return p == remote.PhaseStaleIfError || (e.distrusted && p != remote.PhaseExpired)
}

// modelFreshness is the model's Options.Freshness, read from the value: the
// n-th downstream value lives 1s with no stale-while-revalidate window when
// n%4 == 1, is not cached when n%4 == 3, and takes the Options' lifetime
// otherwise (Set values too).
func modelFreshness(_ string, v string) Freshness {
	var n int
	if _, err := fmt.Sscanf(v[strings.IndexByte(v, '#')+1:], "%d", &n); err != nil || !strings.Contains(v, "#") {
		return Freshness{}
	}
	switch n % 4 {
	case 1:
		return Freshness{TTL: time.Second, StaleWhileRevalidate: -1}
	case 3:
		return Freshness{TTL: -1}
	}
	return Freshness{}
}

func (e *modelEntry) phase(now time.Duration) remote.Phase {
	w := remote.Windows{StaleWhileRevalidate: modelSWR, StaleIfError: modelSIE}
	fresh := e.loadedAt + modelTTL
	if f := modelFreshness("", e.val); f.TTL > 0 {
		w.StaleWhileRevalidate, fresh = 0, e.loadedAt+f.TTL
	}
	if e.notFound {
		w, fresh = remote.Windows{}, e.loadedAt+modelNotFound
	}
	return w.PhaseAt(now, fresh)
}

// modelLimits are the Options.Limit a fuzz input may select: none, a fixed
// bound of 1, and an adaptive bound held at 2 (MinLoads = MaxLoads, so that
// the model knows it), each with a queue of 1. Loads are instant in the
// bubble's time, and MaxWait (with the Loader's LoadTimeout) outlasts any
// input, so only the hold operation makes a load wait or fail.
var modelLimits = [...]Limit{
	{},
	{MaxLoads: 1, MaxQueue: 1, MaxWait: time.Hour},
	{Adaptive: true, MinLoads: 2, MaxLoads: 2, MaxQueue: 1, MaxWait: time.Hour},
}

// model predicts what one Loader does.
type model struct {
	now     time.Duration
	calls   int
	entries map[string]*modelEntry
	stats   Stats // the counters the Loader's Stats must match at the end
	bound   int   // Options.Limit's bound (0: no Limit)
	held    bool  // with a Limit, the hold operation holds every slot and the queue
}

// full reports whether a load started now would fail with ErrLimited, a
// value within StaleIfError answers stale-limited and a refresh is dropped:
// the hold operation holds every slot and the queue.
func (m *model) full() bool { return m.bound > 0 && m.held }

// limited predicts a load that fails with ErrLimited: counted as a load and
// in Limited, no downstream call.
func (m *model) limited() error {
	m.stats.Loads++
	m.stats.Limited++
	return ErrLimited
}

// load applies one downstream call with outcome o, returning its result.
func (m *model) load(key string, o outcome) (string, error) {
	m.calls++
	m.stats.Loads++
	switch o {
	case fail:
		return "", errBoom
	case panics:
		m.stats.Panics++
		return "", &PanicError{}
	case notFound:
		m.entries[key] = &modelEntry{notFound: true, loadedAt: m.now}
		return "", ErrNotFound
	}
	v := fmt.Sprintf("%s#%d", key, m.calls)
	if modelFreshness(key, v).TTL < 0 {
		delete(m.entries, key) // not cached, and the key keeps no older value
		return v, nil
	}
	m.entries[key] = &modelEntry{val: v, loadedAt: m.now}
	return v, nil
}

// revalidate predicts a Get under WithRevalidate: never a hit, always a
// load; a failure is covered by the value held, if still within its
// windows, as any failed load is.
func (m *model) revalidate(key string, o outcome) (string, Source, time.Duration, error) {
	prev := m.entries[key]
	m.stats.Gets++
	m.stats.Misses++
	var v string
	var err error
	if m.full() {
		err = m.limited()
	} else {
		v, err = m.load(key, o)
	}
	if err != nil && !errors.Is(err, ErrNotFound) && prev != nil && !prev.notFound && prev.phase(m.now) != remote.PhaseExpired {
		m.stats.StaleOnError++
		return prev.val, SourceStaleOnError, m.now - prev.loadedAt, nil
	}
	if err != nil {
		return "", SourceLoaded, 0, err
	}
	return v, SourceLoaded, 0, nil
}

// refresh predicts a Refresh: a background load (nothing else is in
// flight between two operations), its value stored as a load's is.
func (m *model) refresh(key string, o outcome) {
	if m.full() {
		m.stats.RefreshesLimited++ // a refresh never queues
		return
	}
	m.stats.Refreshes++
	m.load(key, o)
}

// lookup returns key's entry and its phase now for a Get (expired if there
// is none, or if it is distrusted: the Get reads it again, rule 18).
func (m *model) lookup(key string) (*modelEntry, remote.Phase) {
	e := m.entries[key]
	switch {
	case e == nil:
		return nil, remote.PhaseExpired
	case e.distrusted:
		m.stats.Rereads++
		return e, remote.PhaseExpired
	}
	return e, e.phase(m.now)
}

// get predicts one Get of key whose load (if any) has outcome o.
func (m *model) get(key string, o outcome) (string, Source, time.Duration, error) {
	e, p := m.lookup(key)
	m.stats.Gets++
	switch p {
	case remote.PhaseFresh:
		m.stats.Hits++
		if e.notFound {
			return "", SourceHit, m.now - e.loadedAt, ErrNotFound
		}
		return e.val, SourceHit, m.now - e.loadedAt, nil
	case remote.PhaseStale:
		m.stats.StaleHits++
		v, age := e.val, m.now-e.loadedAt
		switch {
		case m.now < e.refreshAfter:
		case m.full():
			m.stats.RefreshesLimited++ // dropped; the next stale Get tries again
		default:
			m.stats.Refreshes++
			if _, err := m.load(key, o); err != nil && !errors.Is(err, ErrNotFound) {
				e.refreshAfter = m.now + 1 // the backoff delay is 1ns in this model
			}
		}
		return v, SourceStale, age, nil
	case remote.PhaseStaleIfError:
		if m.full() { // rule 22: the held value instead of a load
			m.stats.StaleHits++
			m.stats.StaleLimited++
			return e.val, SourceStaleLimited, m.now - e.loadedAt, nil
		}
	}
	m.stats.Misses++
	var v string
	var err error
	if m.full() {
		err = m.limited()
	} else {
		v, err = m.load(key, o)
	}
	if err != nil && !errors.Is(err, ErrNotFound) && e.covers(m.now) {
		m.stats.StaleOnError++
		return e.val, SourceStaleOnError, m.now - e.loadedAt, nil
	}
	if err != nil {
		return "", SourceLoaded, 0, err
	}
	return v, SourceLoaded, 0, nil
}

// batchCall is one LoadMany call as the test saw it: its number among the
// downstream calls, and its keys, sorted.
type batchCall struct {
	n    int
	keys []string
}

// getMany predicts a GetMany of keys (distinct) whose LoadMany calls (if
// any) have outcome o. The misses go out in one call and the refreshes of
// the stale keys in another, concurrently: seen is the calls the test
// observed, in the order they ran, and the model checks that they are the
// calls it expects and numbers their values by that order. It returns the
// values GetMany must return and the keys that must fail (with ErrLimited
// when limited says so: the misses' call found no slot).
//
// With a Limit, the keys are judged in order: the stale keys' batch takes
// a slot at its first key (or is dropped if there is none), so that with a
// bound of 1 every later key within StaleIfError finds none free and is
// answered stale-limited; the misses' batch takes its slot when it runs,
// after the loop, waiting for the refresh's if need be.
func (m *model) getMany(keys []string, o outcome, seen []batchCall) (vals map[string]string, failed map[string]bool, limited bool, err error) {
	vals, failed = map[string]string{}, map[string]bool{}
	var misses, stale []string
	prev := map[string]*modelEntry{}
	full := m.full() // no slot free for this GetMany's loads
	for _, key := range keys {
		e, p := m.lookup(key)
		m.stats.Gets++
		switch {
		case p == remote.PhaseFresh:
			m.stats.Hits++
			if !e.notFound {
				vals[key] = e.val
			}
		case p == remote.PhaseStale:
			m.stats.StaleHits++
			vals[key] = e.val
			switch {
			case m.now < e.refreshAfter:
			case full && len(stale) == 0:
				m.stats.RefreshesLimited++ // each stale key tries, and is dropped
			default:
				stale = append(stale, key)
				full = full || m.bound == 1 // the batch holds the one slot
			}
		case p == remote.PhaseStaleIfError && full:
			m.stats.StaleHits++
			m.stats.StaleLimited++
			vals[key] = e.val
		default:
			m.stats.Misses++
			misses = append(misses, key)
			prev[key] = e
		}
	}
	slices.Sort(misses)
	slices.Sort(stale)
	var want [][]string
	if len(misses) > 0 && m.full() { // the misses' call fails before the downstream
		limited = true
		m.stats.Loads++
		m.stats.Limited++
		m.stats.BatchLoads++
		m.stats.BatchKeys += uint64(len(misses))
		for _, key := range misses {
			if e := prev[key]; e.covers(m.now) {
				m.stats.StaleOnError++
				vals[key] = e.val
			} else {
				failed[key] = true
			}
		}
		misses = nil
	}
	for _, b := range [][]string{misses, stale} {
		if len(b) > 0 {
			want = append(want, b)
		}
	}
	matched := len(seen) == len(want)
	for _, w := range want {
		matched = matched && slices.ContainsFunc(seen, func(c batchCall) bool { return slices.Equal(c.keys, w) })
	}
	if !matched {
		return nil, nil, false, fmt.Errorf("LoadMany calls %v; model expects one for the misses %v and one for the stale keys %v", seen, misses, stale)
	}
	for _, c := range seen {
		m.calls++
		if c.n != m.calls {
			return nil, nil, false, fmt.Errorf("LoadMany call numbered %d; model says %d", c.n, m.calls)
		}
		m.stats.Loads++
		m.stats.BatchLoads++
		m.stats.BatchKeys += uint64(len(c.keys))
		refresh := slices.Equal(c.keys, stale)
		if refresh {
			m.stats.Refreshes++
		}
		if o == panics {
			m.stats.Panics++
		}
		for _, key := range c.keys {
			switch o {
			case fail, panics:
				if refresh {
					m.entries[key].refreshAfter = m.now + 1
				} else if e := prev[key]; e.covers(m.now) {
					m.stats.StaleOnError++
					vals[key] = e.val
				} else {
					failed[key] = true
				}
			case notFound:
				m.entries[key] = &modelEntry{notFound: true, loadedAt: m.now}
			default:
				v := fmt.Sprintf("%s#%d", key, c.n)
				if !refresh {
					vals[key] = v
				}
				if modelFreshness(key, v).TTL < 0 {
					delete(m.entries, key)
				} else {
					m.entries[key] = &modelEntry{val: v, loadedAt: m.now}
				}
			}
		}
	}
	return vals, failed, limited, nil
}

// peek predicts a Peek of key.
func (m *model) peek(key string) (string, Source, time.Duration, bool) {
	m.stats.Peeks++
	e := m.entries[key]
	if e == nil || e.notFound || e.distrusted {
		return "", SourceNone, 0, false
	}
	switch e.phase(m.now) {
	case remote.PhaseFresh:
		return e.val, SourceHit, m.now - e.loadedAt, true
	case remote.PhaseStale:
		return e.val, SourceStale, m.now - e.loadedAt, true
	}
	return "", SourceNone, 0, false
}

// left amends a prediction of get for a Get that left with its context's
// error before the load it waited for ended: it is counted as Canceled, not
// by how the load ended (covered: get predicted a stale value covering the
// load's failure, SourceStaleOnError), and under CancelAtZero the load was
// abandoned, so key keeps the entry it had before (prev).
func (m *model) left(key string, prev *modelEntry, covered bool, policy Policy) {
	m.stats.Canceled++
	if covered {
		m.stats.StaleOnError-- // predicted for a Get that stayed
	}
	if policy != CancelAtZero {
		return // FinishAndFill: the load fills the cache as predicted
	}
	m.stats.Abandoned++
	if prev == nil {
		delete(m.entries, key)
	} else {
		m.entries[key] = prev
	}
}

// modelInput splits a fuzz input into the Policy and the Limit (the last
// byte of an input of odd length) and the operations, at most maxOps pairs
// of bytes.
func modelInput(data []byte, maxOps int) (Policy, Limit, []byte) {
	policy, limit := FinishAndFill, Limit{}
	if len(data)%2 == 1 {
		c := data[len(data)-1]
		policy, limit = Policy(c%2), modelLimits[c/2%byte(len(modelLimits))]
		data = data[:len(data)-1]
	}
	return policy, limit, data[:min(len(data), 2*maxOps)]
}

// modelHolders is how many loads the hold operation starts: with a Limit,
// enough to hold every slot and fill the queue.
func modelHolders(limit Limit) int {
	if !limit.enabled() {
		return 2
	}
	return limit.MaxLoads + limit.MaxQueue
}

func runModel(t *testing.T, policy Policy, limit Limit, ops []byte) {
	synctest.Test(t, func(t *testing.T) {
		m := &model{entries: map[string]*modelEntry{}, bound: limit.MaxLoads}
		var next outcome
		var mu sync.Mutex // the two LoadMany calls of a GetMany may run at once
		var calls int
		var batches []batchCall
		// The hold operation's loads (keys "h<hold>.<i>", never asked for
		// otherwise) wait on gate; they are not the model's calls.
		var gate chan struct{}
		var holderCalls, holds int
		var holders []<-chan result
		loadMany := func(ctx context.Context, keys []string) (map[string]string, error) {
			mu.Lock()
			calls++
			n := calls
			batches = append(batches, batchCall{n: n, keys: slices.Sorted(slices.Values(keys))})
			mu.Unlock()
			switch next {
			case fail:
				return nil, errBoom
			case panics:
				panic("model panic")
			case notFound:
				return nil, nil
			}
			vals := map[string]string{}
			for _, k := range keys {
				vals[k] = fmt.Sprintf("%s#%d", k, n)
			}
			return vals, nil
		}
		l, err := New(func(ctx context.Context, key string) (string, error) {
			mu.Lock()
			if strings.HasPrefix(key, "h") {
				holderCalls++
				g := gate
				mu.Unlock()
				select {
				case <-g:
					return key, nil
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}
			calls++
			n := calls
			mu.Unlock()
			switch next {
			case fail:
				return "", errBoom
			case panics:
				panic("model panic")
			case notFound:
				return "", ErrNotFound
			}
			return fmt.Sprintf("%s#%d", key, n), nil
		}, Options[string, string]{
			LoadMany: loadMany,
			TTL:      modelTTL, StaleWhileRevalidate: modelSWR, StaleIfError: modelSIE, NotFoundTTL: modelNotFound,
			Freshness:   modelFreshness,
			Policy:      policy,
			Retry:       Retry{InitialInterval: 1, MaxInterval: 1},
			Breaker:     Breaker{Disabled: true},
			Limit:       limit,
			LoadTimeout: time.Hour, // the hold operation's loads outlast any input
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		loc := local[string, string]{l} // what a RemoteWatcher is given
		start := time.Now()
		var revalidations uint64
		// hold starts the hold operation's loads and waits until they hold
		// their slots or wait in the queue; release lets them go and checks
		// that each Get had its value.
		hold := func() {
			mu.Lock()
			gate = make(chan struct{})
			mu.Unlock()
			holds++
			for j := range modelHolders(limit) {
				holders = append(holders, getAsync(t.Context(), l, fmt.Sprintf("h%d.%d", holds, j)))
				synctest.Wait() // in order: the first ones take the slots
			}
			m.stats.Gets += uint64(len(holders))
			m.stats.Misses += uint64(len(holders))
			m.held = true
		}
		release := func(op int) {
			close(gate)
			for _, h := range holders {
				if r := <-h; r.err != nil || !strings.HasPrefix(r.v, "h") {
					t.Fatalf("op %d: a held load's Get = %q, %v; want its value", op, r.v, r.err)
				}
			}
			synctest.Wait()
			m.stats.Loads += uint64(len(holders))
			holders, m.held = nil, false
		}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%14, ops[i+1]
			key := fmt.Sprint("k", arg%3)
			next = outcome(arg / 3 % 4)
			m.now = time.Since(start)
			switch op {
			case 0, 1: // Get, and Get with a cancelled context
				ctx := t.Context()
				if op == 1 {
					c, cancel := context.WithCancel(ctx)
					cancel()
					ctx = c
				}
				prev := m.entries[key]
				wv, ws, wage, werr := m.get(key, next)
				v, info, err := l.GetInfo(ctx, key)
				synctest.Wait() // background refreshes and abandoned loads finish
				if op == 1 && errors.Is(err, context.Canceled) && ws != SourceHit && ws != SourceStale && ws != SourceStaleLimited {
					// Left before the result: allowed. The load was called
					// either way; whether it filled depends on the Policy.
					if info.Source != SourceNone || v != "" {
						t.Fatalf("op %d at %v: Get(%q) with a cancelled context = %q, %v, %v; want no value and Source none",
							i/2, m.now, key, v, info.Source, err)
					}
					m.left(key, prev, ws == SourceStaleOnError, policy)
					break
				}
				var pe *PanicError
				sameErr := errors.Is(err, werr) || (errors.As(werr, &pe) && errors.As(err, &pe))
				if v != wv || info.Source != ws || info.Age != wage || !sameErr {
					t.Fatalf("op %d at %v: Get(%q) with outcome %d = %q, %v, age %v, %v; model says %q, %v, age %v, %v",
						i/2, m.now, key, next, v, info.Source, info.Age, err, wv, ws, wage, werr)
				}
			case 2: // Set
				v := fmt.Sprint("set", i)
				l.Set(key, v)
				m.entries[key] = &modelEntry{val: v, loadedAt: m.now}
			case 3: // Invalidate
				l.Invalidate(key)
				delete(m.entries, key)
			case 6: // Refresh
				m.refresh(key, next)
				l.Refresh(t.Context(), key)
				synctest.Wait()
			case 7: // a revalidating Get
				wv, ws, wage, werr := m.revalidate(key, next)
				revalidations++
				v, info, err := l.GetInfo(WithRevalidate(t.Context()), key)
				synctest.Wait()
				var pe *PanicError
				sameErr := errors.Is(err, werr) || (errors.As(werr, &pe) && errors.As(err, &pe))
				if v != wv || info.Source != ws || info.Age != wage || !sameErr {
					t.Fatalf("op %d at %v: revalidating Get(%q) with outcome %d = %q, %v, age %v, %v; model says %q, %v, age %v, %v",
						i/2, m.now, key, next, v, info.Source, info.Age, err, wv, ws, wage, werr)
				}
			case 8: // GetMany of a set of keys (arg's low bits), a duplicate too
				var keys []string
				for k := range 3 {
					if (arg%7+1)&(1<<k) != 0 {
						keys = append(keys, fmt.Sprint("k", k))
					}
				}
				seenBefore := len(batches)
				got, err := l.GetMany(t.Context(), append(keys, keys[0]))
				synctest.Wait() // the refreshes finish
				wv, wfailed, wlimited, merr := m.getMany(keys, next, batches[seenBefore:])
				if merr != nil {
					t.Fatalf("op %d at %v: GetMany(%v) with outcome %d: %v", i/2, m.now, keys, next, merr)
				}
				var me *ManyError[string]
				if errors.As(err, &me) {
					for k := range me.Errs {
						if !wfailed[k] {
							t.Fatalf("op %d at %v: GetMany(%v): %q failed (%v); model says it did not", i/2, m.now, keys, k, me.Errs[k])
						}
						if wlimited && !errors.Is(me.Errs[k], ErrLimited) {
							t.Fatalf("op %d at %v: GetMany(%v): %q failed with %v; model says ErrLimited", i/2, m.now, keys, k, me.Errs[k])
						}
					}
				} else if err != nil {
					t.Fatalf("op %d at %v: GetMany(%v): %v", i/2, m.now, keys, err)
				}
				if len(wfailed) > 0 && (me == nil || len(me.Errs) != len(wfailed)) {
					t.Fatalf("op %d at %v: GetMany(%v) error %v; model says %v fail", i/2, m.now, keys, err, wfailed)
				}
				if !maps.Equal(got, wv) {
					t.Fatalf("op %d at %v: GetMany(%v) with outcome %d = %v; model says %v", i/2, m.now, keys, next, got, wv)
				}
			case 10: // a Remote drops key: another process wrote it (rule 18)
				loc.Drop(key)
				delete(m.entries, key)
				m.stats.RemoteDrops++
			case 11: // a Remote distrusts every copy (rule 18)
				loc.Distrust()
				for _, e := range m.entries {
					e.distrusted = true
				}
				m.stats.Distrusts++
			case 12: // InvalidateAll (rule 20)
				l.InvalidateAll()
				clear(m.entries)
				m.stats.InvalidateAlls++
			case 13: // hold every downstream slot and the queue, or let them go (rule 22)
				if holders == nil {
					hold()
				} else {
					release(i / 2)
				}
			case 9: // Peek
				wv, ws, wage, wok := m.peek(key)
				v, info, ok := l.Peek(key)
				if v != wv || info.Source != ws || info.Age != wage || ok != wok {
					t.Fatalf("op %d at %v: Peek(%q) = %q, %v, age %v, %v; model says %q, %v, age %v, %v",
						i/2, m.now, key, v, info.Source, info.Age, ok, wv, ws, wage, wok)
				}
			default: // time passes (4, 5)
				time.Sleep(time.Duration(arg%20) * 250 * time.Millisecond)
				synctest.Wait()
			}
			if calls != m.calls {
				t.Fatalf("op %d: %d downstream calls; model says %d", i/2, calls, m.calls)
			}
		}
		if holders != nil {
			release(len(ops) / 2)
		}
		synctest.Wait()
		if want := holds * modelHolders(limit); holderCalls != want {
			t.Errorf("%d calls of the held loads; want %d", holderCalls, want)
		}
		s := l.Stats()
		if s.LoadLimit != int64(limit.MaxLoads) || s.QueuedLoads != 0 {
			t.Errorf("LoadLimit %d, QueuedLoads %d; want %d, 0", s.LoadLimit, s.QueuedLoads, limit.MaxLoads)
		}
		if s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed || s.InFlight != 0 || s.Waiting != 0 {
			t.Errorf("Stats do not add up: %+v", s)
		}
		// Only the counters the model keeps; the others are zero in both.
		got := Stats{
			Gets: s.Gets, Hits: s.Hits, StaleHits: s.StaleHits, Misses: s.Misses,
			StaleOnError: s.StaleOnError, Canceled: s.Canceled, Loads: s.Loads,
			Refreshes: s.Refreshes, Abandoned: s.Abandoned, Panics: s.Panics,
			BatchLoads: s.BatchLoads, BatchKeys: s.BatchKeys, Peeks: s.Peeks,
			RemoteDrops: s.RemoteDrops, Distrusts: s.Distrusts, Rereads: s.Rereads,
			InvalidateAlls: s.InvalidateAlls,
			Limited:        s.Limited, StaleLimited: s.StaleLimited, RefreshesLimited: s.RefreshesLimited,
		}
		m.stats.Revalidations = 0 // counted apart, checked below
		if s.Revalidations != revalidations {
			t.Errorf("Stats.Revalidations = %d; want %d", s.Revalidations, revalidations)
		}
		if got != m.stats {
			t.Errorf("%v, Limit %+v: Stats = %+v;\nmodel says %+v", policy, limit, got, m.stats)
		}
	})
}

func FuzzModel(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 4, 18, 0, 0, 4, 10, 0, 4, 0, 4})              // load, expire, stale, refresh
	f.Add([]byte{0, 1, 4, 19, 0, 4, 0, 7, 0, 1, 3, 1, 0, 1})               // failures, stale-if-error
	f.Add([]byte{0, 11, 0, 11, 4, 5, 0, 2, 2, 2, 0, 2, 1, 0, 4, 19, 1, 6}) // not-found, Set, cancelled Gets
	// CancelAtZero (odd length, last byte odd): cancelled Gets of a cold
	// key, of a stale-if-error key whose load fails, then of a not-found.
	f.Add([]byte{1, 0, 0, 0, 1, 1, 0, 1, 4, 19, 4, 9, 1, 3, 0, 3, 1, 11, 0, 11, 1})
	f.Add([]byte{0, 0, 4, 19, 4, 8, 1, 1, 1, 4, 0, 4, 1, 2, 2, 2, 1, 8, 4, 3, 1, 7, 1})
	// Per-value lifetimes (the 1st value lives 1s, the 3rd is not cached),
	// Refresh (6) and revalidating Gets (7), failing ones included.
	f.Add([]byte{0, 0, 4, 5, 0, 0, 6, 0, 0, 0, 7, 0, 7, 3, 4, 10, 7, 6, 6, 1, 0, 1})
	// GetMany (8) of hits, misses and stale keys, failing and not found
	// ones too, and Peek (9).
	f.Add([]byte{0, 0, 8, 6, 9, 1, 4, 18, 9, 0, 8, 6, 4, 19, 8, 9, 2, 1, 8, 6, 4, 19, 4, 19, 8, 16, 9, 2})
	// A Remote's Drop (10) and Distrust (11): rereads of hits, stale keys,
	// not-founds, through Get, GetMany and Peek, failing ones covered.
	f.Add([]byte{0, 0, 0, 1, 11, 0, 9, 0, 0, 0, 0, 4, 10, 1, 0, 1, 11, 0, 4, 19, 8, 6, 0, 11, 11, 0, 1, 15, 0, 7, 1})
	// InvalidateAll (12) over hits, stale and distrusted keys and a pending
	// not-found, then Gets, GetMany, Peek and Refresh of the keys.
	f.Add([]byte{0, 0, 0, 1, 0, 11, 4, 19, 12, 0, 9, 0, 0, 0, 8, 6, 11, 0, 12, 0, 0, 1, 6, 2, 12, 0, 0, 2})
	// With a Limit (the last byte: 2 is MaxLoads 1, 3 the same under
	// CancelAtZero, 5 the adaptive bound under CancelAtZero), rule 22: the
	// hold operation (13) held over a stale-limited Get, a miss and a
	// cancelled one failing with ErrLimited, a revalidating Get it covers, a
	// dropped Refresh, a limited GetMany and a Peek; then released.
	f.Add([]byte{0, 0, 13, 0, 4, 6, 0, 0, 0, 1, 1, 1, 7, 0, 6, 2, 8, 6, 9, 0, 13, 0, 0, 1, 0, 2, 2})
	// A GetMany whose refresh takes the one slot: its key within
	// StaleIfError is answered stale-limited (with a bound of 2, loaded).
	f.Add([]byte{2, 0, 4, 12, 0, 1, 4, 6, 8, 2, 0, 0, 2})
	f.Add([]byte{2, 0, 4, 12, 0, 1, 4, 6, 8, 2, 0, 0, 5})
	// Held: a GetMany of a stale key (its refresh dropped), one within
	// StaleIfError and a miss; a Distrust, then rereads that ErrLimited
	// fails and the held copies cover, cancelled ones too.
	f.Add([]byte{2, 0, 4, 12, 0, 1, 4, 6, 13, 0, 8, 6, 1, 2, 0, 0, 11, 0, 0, 1, 1, 0, 13, 0, 0, 0, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		policy, limit, ops := modelInput(data, 200)
		runModel(t, policy, limit, ops)
	})
}
