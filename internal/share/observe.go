package share

import (
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/sentinel"
)

// partitionWaits holds what one member waits on the broker's answer for,
// per partition, in the order given: a partition's answer (one per
// request, not per record) settles all of it at once.
type partitionWaits[T any] struct {
	mu      sync.Mutex
	waiting map[int32][]T
}

func (w *partitionWaits[T]) wait(partition int32, v T) {
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = make(map[int32][]T)
	}
	w.waiting[partition] = append(w.waiting[partition], v)
	w.mu.Unlock()
}

// take removes and returns what waits on partition's answer.
func (w *partitionWaits[T]) take(partition int32) []T {
	w.mu.Lock()
	defer w.mu.Unlock()
	waiting := w.waiting[partition]
	delete(w.waiting, partition)
	return waiting
}

// partitions lists the partitions something waits on.
func (w *partitionWaits[T]) partitions() []int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	parts := make([]int32, 0, len(w.waiting))
	for p := range w.waiting {
		parts = append(parts, p)
	}
	return parts
}

// ackWaits are the acknowledgements of one member waiting for the
// broker's answer.
type ackWaits struct {
	partitionWaits[DeliveryObserver]
}

// answered reports the broker's answer for a partition to every
// acknowledgement of it waiting.
func (w *ackWaits) answered(partition int32, err error) {
	for _, o := range w.take(partition) {
		o.Acknowledged(err)
	}
}

// left reports the acknowledgements still waiting when the member left.
func (w *ackWaits) left() {
	for _, p := range w.partitions() {
		w.answered(p, sentinel.ErrShareAckUnconfirmed)
	}
}

// observeAnswer tells the delivery's observer what became of it, and
// queues the acknowledgement for the broker's answer when the observer
// wants it. Called once, by finish, after the acknowledgement was given to
// the client.
// An acknowledgement given after the record's lock ended is reported not
// confirmed (late) at once, whatever the broker answers for its
// partition.
func (d *Delivery) observeAnswer(status kgo.AckStatus, why Reason, late error) {
	if d.obs == nil {
		return
	}
	d.deferMu.Lock()
	err := d.nackErr
	d.deferMu.Unlock()
	if !d.obs.Answered(status, why, err) {
		return
	}
	if late != nil {
		d.obs.Acknowledged(late)
		return
	}
	d.m.acks.wait(d.rec.Partition, d.obs)
}

// lateAck returns the error of an acknowledgement given at now, after
// d's acquisition lock ended, or nil when the lock held (or its end is
// unknown).
func (d *Delivery) lateAck(now time.Time) error {
	dl := d.deadline.Load()
	if dl == 0 || now.UnixNano() < dl {
		return nil
	}
	late := now.Sub(time.Unix(0, dl)).Round(time.Millisecond)
	return fmt.Errorf("safeack: share acknowledgement given %v after the record's acquisition lock ended "+
		"(the broker may have given the record to another member): %w", late, sentinel.ErrShareAckUnconfirmed)
}

// renewal is a lock renewal waiting for the broker's answer: d's lock
// holds until until (unix nanoseconds) once the broker took it.
type renewal struct {
	d     *Delivery
	until int64
}

// renewalWaits are the lock renewals of one member waiting for the
// broker's answer.
type renewalWaits struct{ partitionWaits[renewal] }

// answered moves the deadlines of a partition's renewals on when the
// broker took them in time: an answer that comes after the lock it
// renewed had ended cannot tell whether the renewal reached the broker
// before that end (a stalled link delivers it late, and Kafka 4.4.0 answers
// such a renewal without an error), and the record may have gone to
// another member meanwhile; that deadline stays where it was.
func (w *renewalWaits) answered(partition int32, err error) {
	waiting := w.take(partition)
	if err != nil {
		return
	}
	now := time.Now().UnixNano()
	for _, r := range waiting {
		for {
			cur := r.d.deadline.Load()
			if cur >= r.until || now >= cur || r.d.deadline.CompareAndSwap(cur, r.until) {
				break
			}
		}
	}
}
