package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// A listenMode is how the light processes listen: one implementation
// per -mode, in a file of its own each, registered in modes. broadcast
// is the tier before per-key wake-ups and tracking (this file);
// tracking, the tier with CLIENT TRACKING (tracking.go); sharded, the
// tier where tracking is refused (sharded.go).
type listenMode interface {
	// New opens one light process's listening, on the fleet's Redis as
	// fl describes it, and returns once Redis has confirmed it (its
	// subscriptions, or its tracking and the held keys read). It must
	// cost little CPU per message: a thousand of them share the
	// benchmark's cores.
	New(ctx context.Context, fl *fleet) (listener, error)
}

// A listener is one light process's listening connection(s).
type listener interface {
	// Heard calls fn, for each of its connections, with the address of
	// the master that delivers to it and the messages it has heard so
	// far, counted as that master's deliveries; safe at any time.
	Heard(fn func(node string, msgs int64))
	// Lost reports whether Redis closed its connection (a client output
	// buffer limit, for a listener that could not keep up).
	Lost() bool
	// Close closes it and waits for its goroutine.
	Close() error
}

// modes are the -mode values this instrument implements.
var modes = map[string]listenMode{
	"broadcast": broadcast{},
	"tracking":  tracking{},
	"sharded":   sharded{},
}

// broadcast listens as the tier does today (events.go): one connection
// that SUBSCRIBEs to <Prefix>loaded and <Prefix>invalidated. go-redis's
// ClusterClient opens a subscription's connection to the master of the
// slot of its first channel (osscluster.go, pubSub's newConn), and the
// tier names <Prefix>loaded first: so every process of the fleet lands
// on that one master (fleet.subNode).
type broadcast struct{}

func (broadcast) New(ctx context.Context, fl *fleet) (listener, error) {
	m := newMatcher("message", "subscribe", fl.loaded, fl.invalidated)
	l, err := dialListener(ctx, fl.subNode, m, command("SUBSCRIBE", fl.loaded, fl.invalidated), 2)
	if err != nil {
		return nil, err // not a nil *rawListener in a non-nil listener
	}
	return l, nil
}

// command is a Redis command in RESP.
func command(args ...string) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, bulk(a)...)
	}
	return b
}

// rawListener is a listener on one raw TCP connection: it sends its
// commands once, then only reads, feeding every chunk to its matcher.
type rawListener struct {
	conn   net.Conn
	node   string
	c      counts
	closed atomic.Bool
	lost   atomic.Bool
	done   chan struct{}
}

// dialListener connects to node, sends cmd, reads until acks
// confirmations have come (or ctx ends), and then reads on in a
// goroutine of its own until Close.
func dialListener(ctx context.Context, node string, m *matcher, cmd []byte, acks int64) (*rawListener, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", node)
	if err != nil {
		return nil, err
	}
	l := &rawListener{conn: conn, node: node, done: make(chan struct{})}
	l.c.msgs = make([]atomic.Int64, len(m.pats)-1)
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	buf := make([]byte, 16<<10)
	_, err = conn.Write(cmd)
	for err == nil && l.c.acks.Load() < acks {
		var n int
		n, err = conn.Read(buf)
		m.feed(buf[:n], &l.c)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("listen on %s: %w", node, err)
	}
	_ = conn.SetDeadline(time.Time{})
	go l.read(m, buf)
	return l, nil
}

func (l *rawListener) read(m *matcher, buf []byte) {
	defer close(l.done)
	for {
		n, err := l.conn.Read(buf)
		if n > 0 {
			m.feed(buf[:n], &l.c)
		}
		if err != nil {
			if !l.closed.Load() && !errors.Is(err, net.ErrClosed) {
				l.lost.Store(true)
			}
			return
		}
	}
}

func (l *rawListener) Heard(fn func(string, int64)) { fn(l.node, l.c.total()) }
func (l *rawListener) Lost() bool                   { return l.lost.Load() }

func (l *rawListener) Close() error {
	l.closed.Store(true)
	err := l.conn.Close()
	<-l.done
	return err
}

// group is a light process that listens on several connections, one per
// master (tracking, sharded).
type group []*rawListener

func (g group) Heard(fn func(string, int64)) {
	for _, l := range g {
		l.Heard(fn)
	}
}

func (g group) Lost() bool {
	for _, l := range g {
		if l.Lost() {
			return true
		}
	}
	return false
}

func (g group) Close() error {
	var errs []error
	for _, l := range g {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	return errors.Join(errs...)
}

// openListeners opens n light listeners of mode, at most 32 at a time.
// On an error it closes those it opened.
func openListeners(ctx context.Context, mode listenMode, fl *fleet, n int) ([]listener, error) {
	ls := make([]listener, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ls[i], errs[i] = mode.New(ctx, fl)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeListeners(ls)
		return nil, err
	}
	return ls, nil
}

func closeListeners(ls []listener) {
	for _, l := range ls {
		if l != nil {
			_ = l.Close()
		}
	}
}
