package consume

// What a group engine gives the engine-neutral parts of a subscription (the
// partition workers, the committers, the claims' life, the leader-epoch
// checks, Stats): its session (groupSession) and reads of the cluster for
// the subscription's group and topic (clusterReads). Sarama's consumer group
// is one engine (group.go and the files it names); the interfaces name no
// client library's types, so that another engine is an adapter too.

import (
	"context"

	"github.com/safeack/safeack/internal/kclient"
)

// groupSession is one session of the group member as the engine runs it:
// from the assignment it starts with until it ends (an eager rebalance, a
// fenced or lost member, the subscription stopping). It is what the
// committers, the claim watch and the leader-epoch checks need of it, in
// terms of no client library: Sarama's ConsumerGroupSession has these
// methods, and so can a session of an engine on another client.
//
// The offsets given are the next to consume, as Kafka commits them;
// metadata is the completed tail (frontier), sent with the offset.
type groupSession interface {
	// Context ends with the session; its cause tells why, when the
	// engine knows (see sessionFenced).
	Context() context.Context
	// Claims lists the partitions of each topic the session owns.
	Claims() map[string][]int32
	// MemberID and GenerationID name the member and its session at the
	// coordinator; a transactional commit is fenced with them.
	MemberID() string
	GenerationID() int32
	// MarkOffset records a position to commit; it only ever moves
	// forward. ResetOffset records one at or below the last, which may
	// rewrite the metadata at an unchanged offset.
	MarkOffset(topic string, partition int32, offset int64, metadata string)
	ResetOffset(topic string, partition int32, offset int64, metadata string)
	// Commit sends the recorded positions to the coordinator and returns
	// once it answered or gave up.
	Commit()
}

// clusterReads is what the engine-neutral parts read of the cluster for one
// subscription's group and topic, through the engine's client.
type clusterReads interface {
	// Committed reads the group's commits of partitions (offset and
	// metadata; a partition without one has offset -1), retried as the
	// client retries a request.
	Committed(partitions []int32) (map[int32]kclient.CommittedOffset, error)
	// CommittedOnce is Committed with one request and no retry: its caller
	// bounds its own waits (see fetchCommittedWithin).
	CommittedOnce(partitions []int32) (map[int32]kclient.CommittedOffset, error)
	// LogStart is the partition's first offset in the log.
	LogStart(partition int32) (int64, error)
	// HighWaterMarks lists the partitions' high-water marks, one request
	// per leader and no retry; failed says why a leader did not answer.
	HighWaterMarks(partitions []int32) (hwms map[int32]int64, failed map[int32]error)
	// LeaderEpoch is the epoch of the partition's leader in the client's
	// metadata (cached; an error when it names no leader).
	LeaderEpoch(partition int32) (int32, error)
}

// groupClaim is one partition of a session as the engine claims it; its
// records come to the claim's worker as a feed.
type groupClaim interface {
	Topic() string
	Partition() int32
	// HighWaterMarkOffset is the partition's high-water mark as the
	// claim's last fetch saw it.
	HighWaterMarkOffset() int64
}
