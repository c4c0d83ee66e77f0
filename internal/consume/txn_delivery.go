package consume

import (
	"context"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/sentinel"
)

// txnDeliveryKey is the context key of a delivery's *TxnDelivery.
type txnDeliveryKey struct{}

// TxnDeliveryFromCtx returns the delivery a message context comes from, in
// transactional mode.
func TxnDeliveryFromCtx(ctx context.Context) (*TxnDelivery, bool) {
	if ctx == nil {
		return nil, false
	}
	d, ok := ctx.Value(txnDeliveryKey{}).(*TxnDelivery)
	return d, ok
}

// TxnDelivery buffers the outputs of one delivery of a record until it is
// answered. A redelivery gets a new one, so outputs of a nacked delivery
// can never be taken for the next.
type TxnDelivery struct {
	committer *txnCommitter
	msg       *message.Message // the delivery
	mu        sync.Mutex
	outputs   []*sarama.ProducerMessage
	answered  bool
}

// Publisher is the Txn the delivery's outputs go to.
func (d *TxnDelivery) Publisher() *Txn { return d.committer.pub }

// Add buffers an output of the delivery; it fails with ErrAlreadyAnswered
// once the delivery was answered.
func (d *TxnDelivery) Add(pm *sarama.ProducerMessage) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.answered {
		return sentinel.ErrAlreadyAnswered
	}
	// The router's answer reaches the partition asynchronously: an output
	// published after it must fail even before then.
	select {
	case <-d.msg.Acked():
		return sentinel.ErrAlreadyAnswered
	case <-d.msg.Nacked():
		return sentinel.ErrAlreadyAnswered
	default:
	}
	d.outputs = append(d.outputs, pm)
	return nil
}

// Count returns how many outputs d holds; zero for a nil d.
func (d *TxnDelivery) Count() int {
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.outputs)
}

// Truncate drops the outputs added after the first n, unless d was
// answered meanwhile. A nil d has none.
func (d *TxnDelivery) Truncate(n int) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.answered && len(d.outputs) > n {
		clear(d.outputs[n:])
		d.outputs = d.outputs[:n]
	}
}

// take closes the delivery to more outputs and returns those it holds.
func (d *TxnDelivery) take() []*sarama.ProducerMessage {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.answered = true
	out := d.outputs
	d.outputs = nil
	return out
}
