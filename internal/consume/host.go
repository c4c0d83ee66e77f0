package consume

import (
	"time"

	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/ready"
)

// Host is the subscriber the subscriptions run for: what they tell it
// (readiness, the partitions they own and those they cannot consume,
// commits) and when it closes. sub is the subscription that tells: one
// subscriber has several, each a group member of its own.
type Host interface {
	// Closing is closed when the subscriber closes.
	Closing() <-chan struct{}
	// SetPhase reports where the subscription to topic stands, for Ready.
	SetPhase(sub any, topic string, p ready.Phase, err error)
	// Ended: the subscription ended.
	Ended(sub any)
	// Attach and Detach add and remove a partition the subscription owns,
	// for Stats.
	Attach(w *partition.Worker)
	Detach(w *partition.Worker)
	// AddUnclaimed and RemoveUnclaimed keep the partitions assigned to the
	// subscription that it does not consume, for Unclaimed.
	AddUnclaimed(sub any, u Unclaimed)
	RemoveUnclaimed(sub any, partition int32)
	// Committed is told of every commit when Options.ReportCommits is set.
	Committed(c CommitReport)
}

// TopicPartition names one partition of a topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Unclaimed is a partition assigned to a subscription that it does not
// consume: its claim has not started within a bound after the assignment,
// or its claim runs but its leader stopped answering for it (Claimed).
type Unclaimed struct {
	TopicPartition
	AssignedAt, Since time.Time
	Claimed           bool
	Err               error
}

// CommitReport describes one commit, for Host.Committed: the public
// CommitEvent, with each partition's metadata as sent.
type CommitReport struct {
	Topic, Group  string
	Transactional bool
	Outputs       int
	Start         time.Time
	Duration      time.Duration
	Partitions    []CommittedPartition
	Final         bool
	Err           error
}

// CommittedPartition is one partition's position in a commit.
type CommittedPartition struct {
	Partition int32
	Offset    int64
	Metadata  string
}
