package share

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/sentinel"
)

// ackWaits are the acknowledgements of one member waiting for the
// broker's answer, per partition, in the order they were given.
type ackWaits struct {
	mu      sync.Mutex
	waiting map[int32][]DeliveryObserver
}

func (w *ackWaits) wait(partition int32, o DeliveryObserver) {
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = make(map[int32][]DeliveryObserver)
	}
	w.waiting[partition] = append(w.waiting[partition], o)
	w.mu.Unlock()
}

// answered reports the broker's answer for a partition to every
// acknowledgement of it waiting.
func (w *ackWaits) answered(partition int32, err error) {
	w.mu.Lock()
	waiting := w.waiting[partition]
	delete(w.waiting, partition)
	w.mu.Unlock()
	for _, o := range waiting {
		o.Acknowledged(err)
	}
}

// left reports the acknowledgements still waiting when the member left.
func (w *ackWaits) left() {
	w.mu.Lock()
	var parts []int32
	for p := range w.waiting {
		parts = append(parts, p)
	}
	w.mu.Unlock()
	for _, p := range parts {
		w.answered(p, sentinel.ShareAckUnconfirmed)
	}
}

// observeAnswer tells the delivery's observer what became of it, and
// queues the acknowledgement for the broker's answer when the observer
// wants it. Called once, by finish, after the acknowledgement was given to
// the client.
func (d *Delivery) observeAnswer(status kgo.AckStatus, why Reason) {
	if d.obs == nil {
		return
	}
	d.deferMu.Lock()
	err := d.nackErr
	d.deferMu.Unlock()
	if d.obs.Answered(status, why, err) {
		d.m.acks.wait(d.rec.Partition, d.obs)
	}
}
