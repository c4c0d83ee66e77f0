package consume

import (
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/safeack/safeack/internal/partition"
)

// Options is what the subscriptions of one subscriber need of its
// configuration, built once from it with the defaults applied. The fields
// that come from the public config keep its names.
type Options struct {
	Brokers []string
	// OverwriteSaramaConfig is the subscriber's private copy, auto-commit
	// turned off: safeack commits itself, every CommitEvery.
	OverwriteSaramaConfig *sarama.Config
	ConsumerGroup         string
	// ConsumerProtocol: the group runs the consumer group protocol
	// (KIP-848) on kgo (kgo_group.go) rather than Sarama's classic one;
	// ServerAssignor names the coordinator's assignor ("uniform" or
	// "range").
	ConsumerProtocol     bool
	ServerAssignor       string
	Tracer               kafka.SaramaTracer
	MaxInFlight          int
	DrainTimeout         time.Duration
	ReconnectRetrySleep  time.Duration
	TailMetadataBudget   int
	DisableCompletedTail bool

	// CommitEvery is the commit interval: Sarama's AutoCommit.Interval
	// when the caller enabled auto-commit, CommitInterval otherwise.
	CommitEvery time.Duration
	// DefaultTailBudget: TailMetadataBudget was left zero, so a lower
	// offset.metadata.max.bytes lowers it (see checkTailBudget).
	DefaultTailBudget bool
	// Worker is what every partition worker is configured with; each
	// subscription adds its log fields and a fresh seed for ordering keys.
	Worker partition.Config
	// ReportCommits: the host's Committed wants every commit (an Observer
	// is configured).
	ReportCommits bool
	Logger        watermill.LoggerAdapter
}

// retrySleep is the wait before reconnecting and before retrying a record
// the Unmarshaler rejected: ReconnectRetrySleep, or none for NoSleep.
func (c *Options) retrySleep() time.Duration {
	return max(c.ReconnectRetrySleep, 0)
}
