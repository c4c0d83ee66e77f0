package safeack

import (
	"github.com/safeack/safeack/internal/consume"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/ready"
)

// host is the Subscriber as its subscriptions see it (consume.Host): a
// type of its own, so that the methods they call are not Subscriber's.
type host Subscriber

var _ consume.Host = (*host)(nil)

func (h *host) Closing() <-chan struct{} { return h.closing }

func (h *host) SetPhase(sub any, topic string, p ready.Phase, err error) {
	h.ready.Set(sub, topic, h.cfg.ConsumerGroup, "consumer group", p, err)
}

func (h *host) Ended(sub any) { h.ready.Remove(sub) }

func (h *host) Attach(w *partition.Worker) { h.registry.attach(w) }

func (h *host) Detach(w *partition.Worker) { h.registry.detach(w) }

func (h *host) AddUnclaimed(sub any, u consume.Unclaimed) {
	h.unclaimed.add(sub, UnclaimedPartition{
		TopicPartition: TopicPartition(u.TopicPartition),
		AssignedAt:     u.AssignedAt,
		Since:          u.Since,
		Claimed:        u.Claimed,
		Err:            u.Err,
	})
}

func (h *host) RemoveUnclaimed(sub any, partition int32) { h.unclaimed.remove(sub, partition) }

func (h *host) Committed(c consume.CommitReport) {
	ev := CommitEvent{Topic: c.Topic, Group: c.Group, Transactional: c.Transactional, Outputs: c.Outputs,
		Start: c.Start, Duration: c.Duration, Final: c.Final, Err: c.Err,
		Partitions: make([]CommittedPartition, len(c.Partitions))}
	for i, p := range c.Partitions {
		ev.Partitions[i] = CommittedPartition{Partition: p.Partition, Offset: p.Offset, TailBytes: len(p.Metadata),
			tail: consume.CommittedTail(p.Offset, p.Metadata)}
	}
	h.cfg.Observer.Committed(ev)
}
