package safeack

// fifo is a queue that reuses its storage and has a cheap push to the
// front, for redeliveries. A queue that never empties (records keep
// arriving while earlier ones wait) would otherwise grow its slice by one
// slot per record ever pushed: push moves what is left to the front once
// at least half the slice has been popped, so the storage stays within
// about twice the most the queue held, at an amortized copy of one element
// per pop.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(v T) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:]) // popped slots are zeroed; these held moved values
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, v)
}

func (q *fifo[T]) pushFront(v T) {
	if q.head > 0 {
		q.head--
		q.items[q.head] = v
		return
	}
	var zero T
	q.items = append(q.items, zero)
	copy(q.items[1:], q.items)
	q.items[0] = v
}

func (q *fifo[T]) pop() T {
	var zero T
	v := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return v
}

func (q *fifo[T]) clear() {
	clear(q.items)
	q.items, q.head = q.items[:0], 0
}
