package safeack

import (
	"sync"
	"time"
)

// UnclaimedPartition is a partition assigned to the Subscriber (without a
// consumer group: a partition of a topic it subscribed to) that it does
// not consume: its claim has not started within a bound after the
// assignment (the partition has no leader, or its leader does not
// answer), or its claim runs but its leader stopped answering for it
// (Claimed). See Subscriber.Unclaimed.
type UnclaimedPartition struct {
	TopicPartition
	// AssignedAt is when the member got the partition (without a consumer
	// group: when the connection tried to start it).
	AssignedAt time.Time
	// Since is when the partition stopped being consumed: when it was
	// assigned, or when its last claim ended, for a claim that has not
	// started; the first time its leader did not answer, for one that
	// runs (Claimed).
	Since time.Time
	// Claimed reports a partition whose claim started and whose leader
	// then stopped answering for it: it is in Stats, with the records it
	// took (their handlers run and their acks are committed), but nothing
	// more is fetched, and its high-water mark and lag there are the last
	// ones listed. False: its claim has not started, and it is not in
	// Stats.
	Claimed bool
	// Err is why it is not consumed, as last seen: the cluster names no
	// leader, the leader's answer, or the error Sarama reported for the
	// claim. Nil when not known.
	Err error
}

func (u UnclaimedPartition) topicPartition() TopicPartition { return u.TopicPartition }

// Unclaimed returns the partitions assigned to the Subscriber's consumer
// group members (without a consumer group: the partitions of the topics
// it subscribed to) that they do not consume, ordered by topic and
// partition: those whose claim has not started within a few seconds of
// the assignment (Sarama's Metadata.Retry budget plus 6 s), and those
// whose claim runs but whose leader has not answered for them for as
// long (Claimed). Their records wait; each is logged as an Error when it
// is listed here. The Subscriber keeps the partition (the group has no
// other member to give it to that could do better) and asks for fresh
// metadata every second: a claim that has not started starts within
// about 5 seconds of its leader answering again (without a consumer
// group, within a second), one that runs fetches again once Sarama finds
// the leader (it asks every Consumer.Retry.Backoff). A partition leaves
// the list when it is consumed again, or when it is revoked.
//
// Both group protocols report the same: on GroupProtocolConsumer the claim
// of a partition whose leader does not answer waits, its fetching paused,
// and starts within about a second of its leader answering; one that runs
// fetches again once franz-go finds the leader.
func (s *Subscriber) Unclaimed() []UnclaimedPartition {
	return s.unclaimed.list()
}

// unclaimedSet holds the partitions that Subscriber.Unclaimed lists, by
// subscription (two subscriptions are two members of the group).
type unclaimedSet struct {
	mu    sync.Mutex
	parts map[unclaimedKey]UnclaimedPartition
}

type unclaimedKey struct {
	sub       any
	partition int32
}

func (u *unclaimedSet) add(sub any, p UnclaimedPartition) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.parts == nil {
		u.parts = make(map[unclaimedKey]UnclaimedPartition)
	}
	u.parts[unclaimedKey{sub, p.Partition}] = p
}

func (u *unclaimedSet) remove(sub any, partition int32) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.parts, unclaimedKey{sub, partition})
}

func (u *unclaimedSet) list() []UnclaimedPartition {
	u.mu.Lock()
	out := make([]UnclaimedPartition, 0, len(u.parts))
	for _, p := range u.parts {
		out = append(out, p)
	}
	u.mu.Unlock()
	sortByTopicPartition(out)
	return out
}
