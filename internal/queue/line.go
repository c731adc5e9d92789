package queue

// The queue's order: the waiters, oldest first, and what is given back
// going to them. Every function here is called with mu held.

// fits reports whether a place of cost fits now (see Queue).
func (q *Queue) fits(cost int64) bool {
	return q.held < q.places && (cost == 0 || q.room-q.spent >= cost)
}

// giveLocked gives n places of cost back and grants what then fits.
func (q *Queue) giveLocked(n int, cost int64) {
	q.held -= n
	q.spent -= cost
	q.grant()
	q.update()
}

// grant hands what fits to the oldest waiters, in order: it stops at the
// first that does not fit, so no later one is served before it.
func (q *Queue) grant() {
	for q.waiting > 0 {
		w := q.oldest()
		if !q.fits(w.cost) {
			return
		}
		q.pop()
		q.held++
		q.spent += w.cost
		w.answered, w.granted = true, true
		close(w.ready)
	}
}

// oldest returns the oldest live waiter (there is one), dropping the gone
// ones before it.
func (q *Queue) oldest() *Waiter {
	for q.waiters[q.head].gone {
		q.waiters[q.head] = nil
		q.head++
	}
	return q.waiters[q.head]
}

// push queues w. Half-answered queues move to the front, and gone waiters
// are dropped once they outnumber the live ones, so a queue fed as fast as
// it drains, or one whose waiters keep leaving behind a waiter that stays,
// does not grow.
func (q *Queue) push(w *Waiter) {
	if len(q.waiters)-q.head > 2*q.waiting+16 {
		live := q.waiters[:0]
		for _, x := range q.waiters[q.head:] {
			if !x.gone {
				live = append(live, x)
			}
		}
		clear(q.waiters[len(live):])
		q.waiters, q.head = live, 0
	} else if q.head > 0 && q.head*2 >= len(q.waiters) {
		n := copy(q.waiters, q.waiters[q.head:])
		clear(q.waiters[n:])
		q.waiters, q.head = q.waiters[:n], 0
	}
	q.waiters = append(q.waiters, w)
	q.waiting++
}

// pop takes the oldest live waiter off the queue (there is one).
func (q *Queue) pop() *Waiter {
	w := q.oldest()
	q.waiters[q.head] = nil
	q.head++
	if q.waiting--; q.waiting == 0 {
		q.reset()
	}
	return w
}

// reset empties the queue, which holds no live waiter, dropping its memory
// after a large burst.
func (q *Queue) reset() {
	clear(q.waiters[q.head:])
	if cap(q.waiters) > 1024 {
		q.waiters = nil
	} else {
		q.waiters = q.waiters[:0]
	}
	q.head = 0
}

// update refreshes the flag Full reads.
func (q *Queue) update() { q.full.Store(q.waiting > 0 || q.held >= q.places) }
