package flightcache_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
)

// bus is a fleet in one program: each member is one process's Remote, and
// an Invalidate in one drops the key in every other (a real tier, such as
// flightredis, does this through Redis pub/sub).
type bus struct {
	mu      sync.Mutex
	members []*member
}

type member struct {
	bus   *bus
	local remote.LocalCache[string]
}

func (m *member) Watch(local remote.LocalCache[string]) { m.local = local }

func (m *member) Load(ctx context.Context, _ string, load func(context.Context) (string, error)) (remote.Value[string], error) {
	v, err := load(ctx) // no shared values in this sketch: each process loads
	return remote.Value[string]{Value: v, LoadedAt: time.Now(), Loaded: true}, err
}

func (m *member) Set(_ context.Context, key string, _ remote.Value[string]) {
	m.publish(key)
}

func (m *member) Invalidate(_ context.Context, key string) { m.publish(key) }

func (m *member) publish(key string) {
	m.bus.mu.Lock()
	defer m.bus.mu.Unlock()
	for _, other := range m.bus.members {
		if other != m {
			other.local.Drop(key)
		}
	}
}

func (b *bus) join() *member {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := &member{bus: b}
	b.members = append(b.members, m)
	return m
}

// A Remote that is a RemoteWatcher keeps every process's copy in step: a
// price corrected in one process is not served, fresh, by another.
func ExampleRemoteWatcher() {
	var mu sync.Mutex
	price := "10.00"
	load := func(context.Context, string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		return price, nil
	}
	fleet := &bus{}
	a, _ := flightcache.New(load, flightcache.Options[string, string]{TTL: time.Hour, Remote: fleet.join()})
	b, _ := flightcache.New(load, flightcache.Options[string, string]{TTL: time.Hour, Remote: fleet.join()})
	defer a.Close()
	defer b.Close()

	ctx := context.Background()
	before, _ := b.Get(ctx, "sku-1") // b holds 10.00 for an hour...

	mu.Lock()
	price = "12.50"
	mu.Unlock()
	a.Invalidate("sku-1") // ...until a, which saw the change, invalidates it

	after, _ := b.Get(ctx, "sku-1")
	fmt.Println(before, "->", after, "| b dropped", b.Stats().RemoteDrops)
	// Output: 10.00 -> 12.50 | b dropped 1
}
