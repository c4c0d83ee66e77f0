package share

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Counters count what happened to the records of one partition (the
// public ShareCounters, field for field).
type Counters struct {
	Received, Redelivered           uint64
	MaxDeliveryCount                int32
	Accepted, Released, Rejected    uint64
	DeadLettered                    uint64
	ReleasedAtClose, SkippedClosing uint64
	UnmarshalFailures               uint64
	Deferred                        uint64
	LockRenewals                    uint64
	GivenBack                       uint64
	AckErrors                       uint64
}

// PartitionStats is a snapshot of one partition (the public ShareStats).
type PartitionStats struct {
	Topic             string
	Partition         int32
	InFlight          int
	OldestInFlight    int64
	OldestInFlightAge time.Duration
	Counters
}

type topicPartition struct {
	topic     string
	partition int32
}

// Registry keeps the counters of every partition a ShareSubscriber
// received records of, and its subscriptions for what is in flight.
type Registry struct {
	mu       sync.Mutex
	subs     map[*Subscription]struct{}
	counters map[topicPartition]*Counters
}

func (r *Registry) attach(sub *Subscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subs == nil {
		r.subs = make(map[*Subscription]struct{})
	}
	r.subs[sub] = struct{}{}
}

func (r *Registry) detach(sub *Subscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.subs, sub)
}

// count applies f to the counters of topic/partition, and returns them
// for update.
func (r *Registry) count(topic string, partition int32, f func(*Counters)) *Counters {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counters == nil {
		r.counters = make(map[topicPartition]*Counters)
	}
	tp := topicPartition{topic, partition}
	c := r.counters[tp]
	if c == nil {
		c = new(Counters)
		r.counters[tp] = c
	}
	f(c)
	return c
}

// update applies f to counters count returned, without looking them up.
func (r *Registry) update(c *Counters, f func(*Counters)) {
	r.mu.Lock()
	f(c)
	r.mu.Unlock()
}

// Snapshot returns every partition's statistics, ordered by topic and
// partition. Counters sum over every subscription.
func (r *Registry) Snapshot() []PartitionStats {
	now := time.Now()
	r.mu.Lock()
	byTP := make(map[topicPartition]*PartitionStats, len(r.counters))
	for tp, c := range r.counters {
		byTP[tp] = &PartitionStats{Topic: tp.topic, Partition: tp.partition, Counters: *c}
	}
	subs := make([]*Subscription, 0, len(r.subs))
	for sub := range r.subs {
		subs = append(subs, sub)
	}
	r.mu.Unlock()
	for _, sub := range subs {
		sub.mu.Lock()
		for d := range sub.inFlight {
			tp := topicPartition{d.rec.Topic, d.rec.Partition}
			st := byTP[tp]
			if st == nil {
				st = &PartitionStats{Topic: tp.topic, Partition: tp.partition}
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
	out := make([]PartitionStats, 0, len(byTP))
	for _, st := range byTP {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b PartitionStats) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}
