package share

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"
)

// flushLoop sends the acks given since the last flush every
// AckFlushInterval: lock renewals, and the answers of the messages
// handed out, also while the subscription drains. Once it stops, nothing
// is sent until the members' fetches in flight are answered (see leave),
// for at most fetchSettleLimit.
func (sub *Subscription) flushLoop(done <-chan struct{}) {
	tick := time.NewTicker(sub.cfg.AckFlushInterval)
	defer tick.Stop()
	var stopped time.Time
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if sub.stop.Err() != nil && len(sub.members) > 1 {
			if stopped.IsZero() {
				stopped = time.Now()
			}
			if sub.fetchesInFlight() && time.Since(stopped) < fetchSettleLimit {
				continue
			}
		}
		if !sub.acked.Swap(false) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, m := range sub.members {
			if err := m.client.FlushAcks(ctx); err != nil {
				sub.logger.Error("Flushing share acks", err, nil)
			}
		}
		cancel()
	}
}

// ackResults counts and logs what the broker refused, and passes the
// answers on to the acknowledgements observed.
func (sub *Subscription) ackResults(client *kgo.Client, results kgo.ShareAckResults) {
	var m *member
	for _, mm := range sub.members {
		if mm.client == client {
			m = mm
		}
	}
	for _, r := range results {
		if m != nil && r.Topic == sub.topic {
			m.renewals.answered(r.Partition, r.Err)
			m.acks.answered(r.Partition, r.Err)
		}
		if r.Err == nil {
			continue
		}
		sub.stats.count(r.Topic, r.Partition, func(c *Counters) { c.AckErrors++ })
		sub.logger.Error("Share acknowledgement refused; the broker delivers the records again", r.Err, watermill.LogFields{"partition": r.Partition})
	}
}
