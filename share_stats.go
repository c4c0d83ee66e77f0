package safeack

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// ShareCounters count what happened to the records of one partition that a
// ShareSubscriber received, since it was made.
type ShareCounters struct {
	// Received counts records taken from the share group, redeliveries
	// included; Redelivered those with a delivery count above one.
	Received, Redelivered uint64
	// MaxDeliveryCount is the highest delivery count seen.
	MaxDeliveryCount int32
	// Accepted, Released and Rejected count the acknowledgements given:
	// ACCEPT (an Ack, a dead-lettered record, or one OnUnmarshalError
	// took), RELEASE (a Nack, or Close) and REJECT (RejectPoison, past
	// MaxDeliveries, or an unmarshal failure without OnUnmarshalError).
	Accepted, Released, Rejected uint64
	// DeadLettered counts records accepted after DeadLetter took them.
	DeadLettered uint64
	// ReleasedAtClose counts records released because the subscription
	// ended before they were answered; SkippedClosing those whose handler
	// SkipRevoked did not run.
	ReleasedAtClose, SkippedClosing uint64
	// UnmarshalFailures counts records the Unmarshaler rejected.
	UnmarshalFailures uint64
	// Deferred counts completions deferred with Defer.
	Deferred uint64
	// LockRenewals counts acquisition lock renewals (KIP-1222) of records
	// whose answer took more than half their lock.
	LockRenewals uint64
	// AckErrors counts partition acknowledgements the broker refused (for
	// example after the acquisition lock expired): their records are
	// delivered again.
	AckErrors uint64
}

// ShareStats is a snapshot of one partition a ShareSubscriber received
// records of.
type ShareStats struct {
	TopicPartition
	// InFlight counts messages handed out and not yet answered (a deferred
	// completion counts until it is resolved).
	InFlight int
	// OldestInFlight is the offset of the message handed out longest ago
	// and not answered, and OldestInFlightAge how long ago; valid when
	// InFlight > 0.
	OldestInFlight    int64
	OldestInFlightAge time.Duration
	ShareCounters
}

// Stats returns a snapshot of every partition the ShareSubscriber received
// records of, ordered by topic and partition. Counters sum over every
// subscription.
func (s *ShareSubscriber) Stats() []ShareStats {
	return s.stats.snapshot()
}

type shareRegistry struct {
	mu       sync.Mutex
	subs     map[*shareSubscription]struct{}
	counters map[TopicPartition]*ShareCounters
}

func (r *shareRegistry) attach(sub *shareSubscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subs == nil {
		r.subs = make(map[*shareSubscription]struct{})
	}
	r.subs[sub] = struct{}{}
}

func (r *shareRegistry) detach(sub *shareSubscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.subs, sub)
}

// count applies f to the counters of topic/partition, and returns them
// for update.
func (r *shareRegistry) count(topic string, partition int32, f func(*ShareCounters)) *ShareCounters {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counters == nil {
		r.counters = make(map[TopicPartition]*ShareCounters)
	}
	tp := TopicPartition{Topic: topic, Partition: partition}
	c := r.counters[tp]
	if c == nil {
		c = new(ShareCounters)
		r.counters[tp] = c
	}
	f(c)
	return c
}

// update applies f to counters count returned, without looking them up.
func (r *shareRegistry) update(c *ShareCounters, f func(*ShareCounters)) {
	r.mu.Lock()
	f(c)
	r.mu.Unlock()
}

func (r *shareRegistry) snapshot() []ShareStats {
	now := time.Now()
	r.mu.Lock()
	byTP := make(map[TopicPartition]*ShareStats, len(r.counters))
	for tp, c := range r.counters {
		byTP[tp] = &ShareStats{TopicPartition: tp, ShareCounters: *c}
	}
	subs := make([]*shareSubscription, 0, len(r.subs))
	for sub := range r.subs {
		subs = append(subs, sub)
	}
	r.mu.Unlock()
	for _, sub := range subs {
		sub.mu.Lock()
		for d := range sub.inFlight {
			tp := TopicPartition{Topic: d.rec.Topic, Partition: d.rec.Partition}
			st := byTP[tp]
			if st == nil {
				st = &ShareStats{TopicPartition: tp}
				byTP[tp] = st
			}
			age := now.Sub(d.handedAt)
			if st.InFlight == 0 || age > st.OldestInFlightAge {
				st.OldestInFlight, st.OldestInFlightAge = d.rec.Offset, age
			}
			st.InFlight++
		}
		sub.mu.Unlock()
	}
	out := make([]ShareStats, 0, len(byTP))
	for _, st := range byTP {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b ShareStats) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}
