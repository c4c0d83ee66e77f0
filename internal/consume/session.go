package consume

import "context"

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
