package partition

import "time"

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

// acceptLog remembers when records were taken from Kafka, in offset order,
// so the age of the oldest unfinished one can be told without a map.
type acceptLog struct {
	offsets []int64
	times   []time.Time
	head    int
}

func (l *acceptLog) push(offset int64, at time.Time) {
	if l.head > 0 && l.head >= len(l.offsets)/2 {
		n := copy(l.offsets, l.offsets[l.head:])
		copy(l.times, l.times[l.head:])
		l.offsets, l.times, l.head = l.offsets[:n], l.times[:n], 0
	}
	l.offsets = append(l.offsets, offset)
	l.times = append(l.times, at)
}

// dropBelow forgets records below offset and returns the time of the first
// one left, if any.
func (l *acceptLog) dropBelow(offset int64) (time.Time, bool) {
	for l.head < len(l.offsets) && l.offsets[l.head] < offset {
		l.head++
	}
	if l.head == len(l.offsets) {
		return time.Time{}, false
	}
	return l.times[l.head], true
}
