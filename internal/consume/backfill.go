package consume

import (
	"errors"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// backfillFromStart reports whether a claim must be read from its
// partition's log start although Sarama fetches it from its end: the
// partition was added to the topic after Subscribe (see
// subscription.initialOffset), the group has no commit on it, and Sarama
// resolved Consumer.Offsets.Initial (OffsetNewest) itself. That happens
// when a cooperative rebalance adds the partition to a running session,
// without the Setup that pins its start (pinStarts), or when Setup could
// not list the start. Every record of such a partition was written after
// Subscribe, and those written before the group noticed it would be
// skipped.
func (h *groupHandler) backfillFromStart(claim sarama.ConsumerGroupClaim) bool {
	p := claim.Partition()
	if claim.InitialOffset() != sarama.OffsetNewest || h.sub.initialOffset(p) != sarama.OffsetOldest {
		return false
	}
	// A commit out of range makes Sarama fall back to Offsets.Initial
	// too; eager sessions leave such a partition there as well.
	held, err := kclient.FetchCommitted(h.client, h.sub.cfg.ConsumerGroup, claim.Topic(), []int32{p})
	if err != nil {
		h.sub.logger.Error("Cannot read the group's commit on a partition added after Subscribe; it starts where Sarama started it", err,
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": p}))
		return false
	}
	c, ok := held[p]
	return !ok || c.Offset < 0
}

// logStart resolves where a backfilled claim starts: its partition's log
// start now. When it cannot be listed, the first record fixes the start
// (Stats shows 0 until then).
func (h *groupHandler) logStart(claim sarama.ConsumerGroupClaim) partition.Start {
	off, err := h.client.GetOffset(claim.Topic(), claim.Partition(), sarama.OffsetOldest)
	if err != nil {
		h.sub.logger.Debug("Cannot list the start of a partition added after Subscribe; it starts at its first record",
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": claim.Partition(), "err": err.Error()}))
		return partition.Start{}
	}
	return partition.Start{Offset: off, Resolved: true}
}

// backfill returns the records of claim's partition from its log start on,
// for a claim that Sarama fetches from the end (see backfillFromStart).
// Records come from a partition consumer of its own, started at
// OffsetOldest, until it has delivered every offset the claim has: the
// claim's records are read meanwhile (its closing is how a revocation
// shows) and dropped, since the own consumer delivers them too. Once the
// own consumer has passed the last claim record read, it is closed and the
// claim's records after the last one delivered follow. The returned
// channel closes when the claim does, or when done closes.
//
// The worker's start is the log start as ConsumeClaim listed it (see
// logStart), committed before anything is handed out (Assignment.PinStart),
// so that a next owner resumes there even if this claim ends before its
// first record; if it could not be listed, the first record delivered
// fixes it, as for any claim that starts at a sentinel.
func (h *groupHandler) backfill(claim sarama.ConsumerGroupClaim, done <-chan struct{}) <-chan *sarama.ConsumerMessage {
	out := make(chan *sarama.ConsumerMessage, cap(claim.Messages()))
	go func() {
		defer close(out)
		b := &backfiller{h: h, topic: claim.Topic(), partition: claim.Partition()}
		defer b.closeSide()
		if !b.catchUp(claim.Messages(), out, done) {
			return
		}
		b.closeSide()
		for m := range claim.Messages() {
			if m.Offset <= b.lastSide {
				continue
			}
			select {
			case out <- m:
			case <-done:
				return
			}
		}
	}()
	return out
}

// backfiller is the state of one backfill: the own partition consumer and
// how far it and the claim have come.
type backfiller struct {
	h         *groupHandler
	topic     string
	partition int32

	consumer sarama.Consumer
	side     sarama.PartitionConsumer
	lastSide int64 // the last offset delivered; -1 none
}

// catchUp delivers the own consumer's records until it has passed the last
// claim record read. It reports false when the claim closed or done did.
func (b *backfiller) catchUp(claim <-chan *sarama.ConsumerMessage, out chan<- *sarama.ConsumerMessage, done <-chan struct{}) bool {
	b.lastSide = -1
	lastClaim := int64(-1) // the last claim record read (and dropped); -1 none
	var pending *sarama.ConsumerMessage
	var pace backoff.Doubling
	var retry <-chan time.Time
	openSide := func() {
		if err := b.openSide(); err != nil {
			wait := pace.Next()
			b.h.sub.logger.Info("Cannot read a partition added after Subscribe from its start; retrying",
				b.h.sub.logFields.Add(watermill.LogFields{"kafka_partition": b.partition, "err": err.Error(), "retry_in": wait.String()}))
			retry = time.After(wait)
			return
		}
		pace.Reset()
	}
	openSide()
	b.h.sub.logger.Debug("Partition added after Subscribe: reading it from its start beside the claim",
		b.h.sub.logFields.Add(watermill.LogFields{"kafka_partition": b.partition}))
	for {
		// Caught up: every offset the claim delivered so far, the own
		// consumer delivered too. Without a claim record the claim's start
		// is not known, so the own consumer goes on.
		if pending == nil && lastClaim >= 0 && b.lastSide >= lastClaim {
			b.h.sub.logger.Debug("Partition added after Subscribe: read from its start up to the claim",
				b.h.sub.logFields.Add(watermill.LogFields{"kafka_partition": b.partition, "offset": b.lastSide}))
			return true
		}
		var sideC <-chan *sarama.ConsumerMessage
		var send chan<- *sarama.ConsumerMessage
		if pending != nil {
			send = out
		} else if b.side != nil {
			sideC = b.side.Messages()
		}
		select {
		case m, ok := <-claim:
			if !ok {
				return false
			}
			lastClaim = m.Offset
		case m, ok := <-sideC:
			if !ok {
				// Retention moved the log start past the next offset, or
				// the leader failed for good: open it again after what was
				// delivered.
				b.closeSide()
				openSide()
				continue
			}
			if m.Offset > b.lastSide {
				pending = m
			}
		case send <- pending:
			b.lastSide = pending.Offset
			pending = nil
		case <-retry:
			retry = nil
			openSide()
		case <-done:
			return false
		}
	}
}

// openSide starts the own partition consumer after the last offset
// delivered, or at the log start when that offset is gone (or none was).
func (b *backfiller) openSide() error {
	if b.consumer == nil {
		c, err := sarama.NewConsumerFromClient(b.h.client)
		if err != nil {
			return err
		}
		b.consumer = c
	}
	from := sarama.OffsetOldest
	if b.lastSide >= 0 {
		from = b.lastSide + 1
	}
	pc, err := b.consumer.ConsumePartition(b.topic, b.partition, from)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) && from != sarama.OffsetOldest {
		pc, err = b.consumer.ConsumePartition(b.topic, b.partition, sarama.OffsetOldest)
	}
	if err != nil {
		return err
	}
	go func() {
		// Drained so that Sarama never blocks on them
		// (Consumer.Return.Errors).
		for err := range pc.Errors() {
			b.h.sub.logger.Debug("Reading a partition added after Subscribe from its start",
				b.h.sub.logFields.Add(watermill.LogFields{"kafka_partition": b.partition, "err": err.Error()}))
		}
	}()
	b.side = pc
	return nil
}

// closeSide closes the own consumer.
func (b *backfiller) closeSide() {
	if b.side != nil {
		b.side.AsyncClose()
		for range b.side.Messages() {
		}
		b.side = nil
	}
	if b.consumer != nil {
		if err := b.consumer.Close(); err != nil {
			b.h.sub.logger.Debug("Closing the consumer of a partition's start", b.h.sub.logFields.Add(watermill.LogFields{"kafka_partition": b.partition, "err": err.Error()}))
		}
		b.consumer = nil
	}
}
