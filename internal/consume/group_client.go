package consume

import (
	"errors"
	"slices"

	"github.com/IBM/sarama"
)

// leaderlessPartitions returns, for those of partitions of topic whose
// cached metadata names no leader, errNoLeader.
func leaderlessPartitions(client sarama.Client, topic string, partitions []int32) map[int32]error {
	writable, err := client.WritablePartitions(topic)
	if err != nil {
		return nil
	}
	var out map[int32]error
	for _, p := range partitions {
		if !slices.Contains(writable, p) {
			if out == nil {
				out = make(map[int32]error)
			}
			out[p] = errNoLeader
		}
	}
	return out
}

// groupClient is the client a subscription's consumer group runs on: the
// subscription's, with two answers changed for Sarama's consumer group.
type groupClient struct {
	sarama.Client
	watch *claimWatch
}

// RefreshMetadata is the client's, except that partitions without a leader
// are not an error: Sarama stores the rest of the answer, the consumer
// group assigns such a partition like any other, and its claim waits for a
// leader (see claimWatch). Sarama's Consume would give up on it before
// joining the group.
func (c *groupClient) RefreshMetadata(topics ...string) error {
	err := c.Client.RefreshMetadata(topics...)
	if err != nil && onlyLeadersMissing(err) {
		return nil
	}
	return err
}

// PartitionNotReadable tells Sarama's session whether to hold a claim back
// before starting it: the client's answer (no leader in its metadata), or
// the watch's (see claimWatch.holds).
func (c *groupClient) PartitionNotReadable(topic string, partition int32) bool {
	return c.Client.PartitionNotReadable(topic, partition) || c.watch.holds(topic, partition)
}

// onlyLeadersMissing reports whether a metadata refresh failed only for
// topics or partitions without a leader: every error it joins is
// LEADER_NOT_AVAILABLE, whose answers Sarama keeps.
func onlyLeadersMissing(err error) bool {
	switch e := err.(type) {
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, inner := range errs {
			if !onlyLeadersMissing(inner) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return onlyLeadersMissing(e.Unwrap())
	}
	return errors.Is(err, sarama.ErrLeaderNotAvailable)
}
