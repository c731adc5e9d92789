package track

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// connloss.go notices the close of a tracked connection. Redis forgets what
// a connection tracked when it goes, and sends no invalidation of it: a
// connection killed (CLIENT KILL), closed by Redis's idle timeout or its
// output buffer limits, dropped by go-redis after a failed or timed-out
// read, reaped as idle or old (ConnMaxIdleTime, ConnMaxLifetime), or
// closed with its client. go-redis closes every connection it drops
// itself, and finds one Redis closed the next time it takes it from the
// pool (at the latest the next health check, which runs CLIENT
// TRACKINGINFO on it), so a close of the net.Conn is the one event all of
// them share: the dialer of a node's tracked client wraps each connection,
// and its Close reports the loss.

// caching is how a tracked read starts on the wire: the command name of
// CLIENT CACHING yes, as RESP sends it. With OPTIN a connection tracks only
// the keys read after it.
var caching = []byte("$7\r\nCACHING\r\n")

// WatchDialer returns a dialer for o's connections (o's own, or go-redis's
// default for o) whose connections call lost when they close, once, if
// they carried a tracked read.
func WatchDialer(o *redis.Options, lost func()) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := o.Dialer
	if dial == nil {
		dial = redis.NewDialer(o)
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		w := &watchedConn{Conn: cn, lost: lost}
		if sc, ok := cn.(syscall.Conn); ok {
			// go-redis checks a pooled connection's socket (a peek for
			// EOF) only through syscall.Conn: keep it visible.
			return &watchedSysConn{w, sc}, nil
		}
		return w, nil
	}
}

// watchedConn is a tracked connection.
type watchedConn struct {
	net.Conn
	tracked atomic.Bool // a CLIENT CACHING yes was written: Redis may track keys for it
	once    sync.Once
	lost    func()
}

// Write notes a tracked read before it is sent.
func (c *watchedConn) Write(b []byte) (int, error) {
	if !c.tracked.Load() && bytes.Contains(b, caching) {
		c.tracked.Store(true)
	}
	return c.Conn.Write(b)
}

// Close reports the loss of what the connection tracked, then closes it.
func (c *watchedConn) Close() error {
	if c.tracked.Load() {
		c.once.Do(c.lost)
	}
	return c.Conn.Close()
}

// watchedSysConn is a watchedConn over a connection with a file
// descriptor.
type watchedSysConn struct {
	*watchedConn
	sys syscall.Conn
}

// SyscallConn is the wrapped connection's, for go-redis's health check.
func (c *watchedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }
