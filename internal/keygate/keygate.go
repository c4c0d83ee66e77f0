// Package keygate serializes work that shares a key while letting work with
// different keys run side by side.
//
// A Gate holds, per busy key, the items waiting for it in admission order.
// An item whose key is idle starts at once; an item whose key is busy waits
// without blocking items of other keys (no head-of-line blocking). Every
// operation costs O(1) on average regardless of how many keys are busy or
// how many items wait, and in steady state allocates nothing: idle lanes and
// their queues are recycled.
//
// A Gate is single-owner; callers serialize access.
package keygate

// Gate admits items keyed by a 64-bit key hash. Callers hash keys themselves
// (for example with hash/maphash); two keys with the same hash are treated as
// one key, which only ever serializes more, never less.
type Gate[T any] struct {
	busy    map[uint64]*lane[T]
	free    []*lane[T]
	waiting int
}

// lane is the FIFO of items waiting for one busy key.
type lane[T any] struct {
	items []T
	head  int
}

// New returns an empty Gate.
func New[T any]() *Gate[T] {
	return &Gate[T]{busy: make(map[uint64]*lane[T])}
}

// Admit offers an item for key. It returns true when the key was idle: the
// key is now busy and the item may start. Otherwise the item waits for the
// key and is returned by a later Release, in admission order.
func (g *Gate[T]) Admit(key uint64, item T) bool {
	l, ok := g.busy[key]
	if !ok {
		g.busy[key] = g.newLane()
		return true
	}
	if l.head > 0 && l.head >= len(l.items)/2 {
		// Slide the live items down rather than grow: a key that always
		// has someone waiting must not make its queue grow forever.
		n := copy(l.items, l.items[l.head:])
		clear(l.items[n:])
		l.items, l.head = l.items[:n], 0
	}
	l.items = append(l.items, item)
	g.waiting++
	return false
}

// Release ends the running item of key. When items wait for the key, the
// oldest is returned with ok true: it now holds the key and may start.
// Otherwise the key becomes idle. Releasing an idle key does nothing.
func (g *Gate[T]) Release(key uint64) (next T, ok bool) {
	l, busy := g.busy[key]
	if !busy {
		return next, false
	}
	if l.head == len(l.items) {
		delete(g.busy, key)
		g.recycle(l)
		return next, false
	}
	next = l.items[l.head]
	var zero T
	l.items[l.head] = zero // let the item be collected once it is done
	l.head++
	if l.head == len(l.items) {
		// Reuse the queue's storage from its start once it has emptied.
		l.items, l.head = l.items[:0], 0
	}
	g.waiting--
	return next, true
}

// Busy reports how many keys are held.
func (g *Gate[T]) Busy() int { return len(g.busy) }

// Waiting reports how many items wait for a busy key.
func (g *Gate[T]) Waiting() int { return g.waiting }

// WaitingFor reports how many items wait for key.
func (g *Gate[T]) WaitingFor(key uint64) int {
	if l, ok := g.busy[key]; ok {
		return len(l.items) - l.head
	}
	return 0
}

// Drain removes every waiting item, calling fn on each in no particular
// key order (but in admission order per key), and makes every key idle.
func (g *Gate[T]) Drain(fn func(T)) {
	for key, l := range g.busy {
		for _, it := range l.items[l.head:] {
			if fn != nil {
				fn(it)
			}
		}
		delete(g.busy, key)
		g.recycle(l)
	}
	g.waiting = 0
}

func (g *Gate[T]) newLane() *lane[T] {
	if n := len(g.free); n > 0 {
		l := g.free[n-1]
		g.free = g.free[:n-1]
		return l
	}
	return &lane[T]{}
}

// maxFreeLanes bounds the recycled lanes so a burst of distinct keys does
// not pin memory forever.
const maxFreeLanes = 1024

func (g *Gate[T]) recycle(l *lane[T]) {
	var zero T
	for i := l.head; i < len(l.items); i++ {
		l.items[i] = zero
	}
	l.items, l.head = l.items[:0], 0
	if len(g.free) < maxFreeLanes && cap(l.items) <= 64 {
		g.free = append(g.free, l)
	}
}
