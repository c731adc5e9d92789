package main

import (
	"bytes"
	"net"
	"strconv"
	"sync/atomic"
)

// counts is what one listening connection (or one real process's client)
// has heard: the messages of each channel it listens to, and the
// confirmations of its subscriptions. Its fields are written by the
// connection's reading goroutine and read by anyone.
type counts struct {
	msgs  []atomic.Int64 // per channel, in the order of the matcher's channels
	from  int            // total counts msgs[from:]: the patterns before are parts of later ones
	acks  atomic.Int64   // subscribe confirmations
	bytes atomic.Int64
}

// total returns the messages heard, all channels together.
func (c *counts) total() int64 {
	var n int64
	for i := c.from; i < len(c.msgs); i++ {
		n += c.msgs[i].Load()
	}
	return n
}

// matcher counts, in a byte stream read in chunks of any size, the
// push messages of a few channels and the subscription confirmations. A
// message is matched by its fixed RESP encoding, which RESP2 (an array)
// and RESP3 (a push) share after its first line:
//
//	$7\r\nmessage\r\n$<len>\r\n<channel>\r\n
//
// It keeps the last bytes of the previous chunk, fewer than the longest
// pattern, so that a pattern split across two reads is counted once, in
// the read that completes it (those kept whole in that tail were counted
// already: they are taken off; no pattern overlaps itself). It is cheap: a few bytes.Count per read,
// no parsing, no allocation after the first read. One matcher per
// connection; it is not safe for concurrent use.
type matcher struct {
	pats [][]byte // one per channel, then the confirmation last
	tail []byte   // the previous chunk's last len(longest)-1 bytes
	buf  []byte   // tail + chunk
}

// newMatcher returns a matcher for messages of channels, whose
// confirmations are of kind ("subscribe", "ssubscribe") and for the
// push kind msg ("message", "smessage").
func newMatcher(msg, kind string, channels ...string) *matcher {
	pats := make([]string, len(channels))
	for i, ch := range channels {
		pats[i] = bulk(msg) + bulk(ch)
	}
	return newRawMatcher(bulk(kind), pats...)
}

// newRawMatcher returns a matcher that counts each of pats as a message
// and ack as a confirmation, all given in their RESP encoding. No
// pattern may overlap itself.
func newRawMatcher(ack string, pats ...string) *matcher {
	m := &matcher{}
	for _, p := range pats {
		m.pats = append(m.pats, []byte(p))
	}
	m.pats = append(m.pats, []byte(ack))
	return m
}

// tierMatcher counts what a real process's tier hears, on any of its
// connections: first the wake-up broadcasts of the loaded channel (a
// part of the next pattern's count, left out of total), then every
// pub/sub message (classic: the broadcasts, the invalidations
// redirected to __redis__:invalidate, the per-key wake-ups on one node;
// sharded: the per-key wake-ups and sharded invalidations on a Cluster)
// and every RESP3 invalidation push.
func tierMatcher(loaded string) *matcher {
	return newRawMatcher(bulk("subscribe"), bulk("message")+bulk(loaded), bulk("message"), bulk("smessage"), bulk("invalidate"))
}

// bulk is s as a RESP bulk string.
func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

// feed counts the patterns that end in chunk into c.
func (m *matcher) feed(chunk []byte, c *counts) {
	m.buf = append(append(m.buf[:0], m.tail...), chunk...)
	last := len(m.pats) - 1
	for i, p := range m.pats {
		n := bytes.Count(m.buf, p) - bytes.Count(m.tail, p)
		if n == 0 {
			continue
		}
		if i == last {
			c.acks.Add(int64(n))
		} else {
			c.msgs[i].Add(int64(n))
		}
	}
	c.bytes.Add(int64(len(chunk)))
	keep := 0
	for _, p := range m.pats {
		keep = max(keep, len(p)-1)
	}
	keep = min(keep, len(m.buf))
	m.tail = append(m.tail[:0], m.buf[len(m.buf)-keep:]...)
}

// countingConn is a net.Conn whose reads are fed to a matcher: a real
// process's Redis client dials through it (go-redis's Dialer option), so
// that what its tier's subscription hears is counted without touching
// the tier. Only the subscription's connection receives messages; the
// others feed the matcher values and replies that never match.
type countingConn struct {
	net.Conn
	m *matcher
	c *counts
}

func (cc *countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	if n > 0 {
		cc.m.feed(p[:n], cc.c)
	}
	return n, err
}
