package safeack

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/consume"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/sentinel"
)

// NoSleep can be set to SubscriberConfig.NackResendSleep and
// SubscriberConfig.ReconnectRetrySleep to retry at once. It equals
// watermill-kafka's kafka.NoSleep.
const NoSleep time.Duration = kafka.NoSleep

// Defaults applied by NewSubscriber to zero-valued fields. With a consumer
// group, an unset DrainTimeout is DefaultDrainTimeout or half of the
// group's Rebalance.Timeout, whichever is shorter, so that leaving it unset
// never makes a Sarama config that Sarama accepts invalid.
const (
	DefaultMaxInFlight            = 64
	DefaultMaxPendingPerPartition = 10_000
	DefaultDrainTimeout           = 5 * time.Second
	DefaultNackResendSleep        = 100 * time.Millisecond
	DefaultReconnectRetrySleep    = time.Second
	DefaultCommitInterval         = time.Second
)

// SubscriberConfig configures a Subscriber. Its fields up to Tracer keep the
// names and meanings of watermill-kafka v3's kafka.SubscriberConfig, so that
// moving an application from watermill-kafka changes an import and a
// constructor; the fields after it are safeack's own.
type SubscriberConfig struct {
	// Brokers lists the Kafka bootstrap brokers, host:port.
	Brokers []string

	// Unmarshaler turns Kafka records into Watermill messages.
	// Default: kafka.DefaultMarshaler{}.
	Unmarshaler kafka.Unmarshaler

	// OverwriteSaramaConfig holds Sarama settings. Nil means
	// DefaultSaramaSubscriberConfig(). safeack never changes the caller's
	// value: it works on a copy, so one value may serve several
	// subscribers. Sarama's balance strategies keep state between
	// rebalances, so each consumer group gets fresh instances of the ones
	// in Consumer.Group.Rebalance (range, roundrobin, sticky,
	// cooperative-sticky); a BalanceStrategy of your own is shared as
	// given and must be safe for concurrent use by several groups. With a
	// ConsumerGroup, Version must be at least 0.10.2, as Sarama's consumer
	// groups need (GroupProtocolClassic; GroupProtocolConsumer opens no
	// Sarama client, and Version does not matter to it).
	OverwriteSaramaConfig *sarama.Config

	// ConsumerGroup is the Kafka consumer group. When empty, every partition
	// of the topic is consumed from Consumer.Offsets.Initial with the same
	// concurrency, and nothing is committed.
	ConsumerGroup string

	// GroupProtocol is the consumer group protocol the ConsumerGroup runs:
	// GroupProtocolClassic (the zero value: Sarama's consumer group) or
	// GroupProtocolConsumer (KIP-848, Kafka 4.0+, on franz-go). See
	// docs/group-protocols.md for what each Sarama setting means under each.
	GroupProtocol GroupProtocol

	// RemoteAssignor names the group coordinator's assignor with
	// GroupProtocolConsumer: RemoteAssignorUniform (the default) or
	// RemoteAssignorRange. It must be empty with GroupProtocolClassic,
	// whose assignors are Sarama's (Consumer.Group.Rebalance).
	RemoteAssignor RemoteAssignor

	// NackResendSleep is how long after a Nack the message is redelivered.
	// Default 100 ms; NoSleep redelivers at once.
	NackResendSleep time.Duration

	// ReconnectRetrySleep is how long to wait before reconnecting after the
	// consumer stopped on an error. It also paces retries of a record the
	// Unmarshaler rejects. Default 1 s; NoSleep retries at once.
	ReconnectRetrySleep time.Duration

	// InitializeTopicDetails is used by SubscribeInitialize to create the
	// topic.
	InitializeTopicDetails *sarama.TopicDetail

	// DoNotWaitForTopicCreation makes SubscribeInitialize return without
	// waiting for the topic's partitions to have leaders.
	DoNotWaitForTopicCreation bool

	// WaitForTopicCreationTimeout bounds that wait. Default 10 s.
	WaitForTopicCreationTimeout time.Duration

	// OTELEnabled, with a nil Tracer, traces each consumed record with
	// OpenTelemetry through otelsarama: Tracer becomes
	// kafka.NewOTELSaramaTracer(), as in watermill-kafka.
	//
	// Deprecated: set Tracer to kafka.NewOTELSaramaTracer() instead, as
	// watermill-kafka advises.
	OTELEnabled bool

	// Tracer wraps the Sarama consumer and consumer-group handler, as in
	// watermill-kafka (for example kafka.NewOTELSaramaTracer()). Nil: no
	// tracing. With a Tracer every record comes through the wrapped claim,
	// so a session's first records wait for Sarama's first fetch (see
	// the early first fetch in docs/how-it-works.md).
	Tracer kafka.SaramaTracer

	// MaxInFlight bounds the messages handed out by one Subscribe call and
	// not yet acked or nacked, across all its partitions. It is the
	// concurrency a Watermill router gets from this subscriber.
	// A message whose partition was revoked stops counting once the drain
	// gave up on it (DrainTimeout), so a handler that ignores its cancelled
	// context can briefly run beside MaxInFlight newer ones.
	// Default 64.
	MaxInFlight int

	// MaxPendingPerPartition bounds the records retained per partition:
	// running ones, ones waiting behind a busy key, and completed ones
	// blocked behind an unfinished record. At the bound the partition stops
	// fetching until a completion frees room. Default 10,000.
	MaxPendingPerPartition int

	// DrainTimeout is how long a revoked partition, or Close, waits for
	// handed-out messages to be acked before giving up on them. The drain
	// hands out nothing new, but the contexts of messages already handed
	// out stay alive until it gives up: a handler that finishes within
	// DrainTimeout has its ack committed. When the drain gives up, those
	// contexts are cancelled and the records are left for the next owner:
	// at-least-once. Keep it below the group's Rebalance.Timeout. Without
	// a ConsumerGroup nothing is committed, but the acks it waits for move
	// the position a reconnect resumes at. Default 5 s, or half of
	// Rebalance.Timeout when that is shorter (see DefaultDrainTimeout).
	DrainTimeout time.Duration

	// CommitInterval is how often the completed prefixes are committed.
	// Set, it is the period, whether Sarama's auto-commit is on or off.
	// Left zero, the period is Sarama's Consumer.Offsets.AutoCommit.Interval
	// when auto-commit is on (Sarama's default, 1 s: a config moved from
	// watermill-kafka keeps its period), and 1 s when it is off. Either way
	// safeack commits itself (Sarama's own auto-commit is turned off in
	// safeack's copy): completed tails are encoded just before each commit,
	// so a completed record is covered within one period plus a round trip,
	// and a partition whose every received record is complete is committed
	// at once (early commits are at least a tenth of the period, and at most
	// 100 ms, apart). Subscriber.CommitInterval reports the period in use.
	// In transactional mode TxnConfig.CommitInterval is the period instead.
	// At least 1 ms.
	CommitInterval time.Duration

	// Ordering chooses which records may be handled at the same time.
	// Default OrderByKey.
	Ordering Ordering

	// OrderingKey, when set with OrderByKey, computes the ordering key
	// from the raw record instead of using the Kafka key (for example a
	// header). Records whose ordering key is empty are ordered like
	// key-less records: one at a time per partition. Returning distinct
	// keys (say, the offset) lets them run concurrently. It must be cheap
	// and must not keep msg.
	OrderingKey func(msg *sarama.ConsumerMessage) []byte

	// OnUnmarshalError decides the fate of a record the Unmarshaler
	// rejects. Nil (the default) stops the partition at that record:
	// nothing is committed past it, the error is logged, and unmarshalling
	// is retried every ReconnectRetrySleep until it succeeds or the
	// partition is revoked. A non-nil handler is given the raw record
	// instead; when it returns nil the record counts as completed (for
	// example after publishing it to a dead-letter topic), and when it
	// returns an error it is retried the same way. Never a silent skip.
	OnUnmarshalError func(ctx context.Context, msg *sarama.ConsumerMessage, err error) error

	// DisableCompletedTail turns off the completed tail in commit metadata.
	// By default each commit carries, in its metadata, which records after
	// the committed offset already completed (see frontier.EncodeTail), and
	// a member that gets the partition skips them instead of handling them
	// again. The metadata also carries the partition's leader epoch, which
	// the next start checks against the log (OffsetForLeaderEpoch, as
	// Kafka's own consumer does) to find a log truncated under the commit
	// by an unclean leader election: the start then moves back to where
	// the log diverged and the tail is cut there; a member consuming the
	// partition checks each new leader epoch the same way before its
	// commits carry it. Disabled, commits carry
	// plain offsets and empty metadata; the tails (and leader epochs) that
	// earlier members of the group committed are still read, their records
	// skipped and their epochs checked (reading one is not writing one): a
	// member with the tail off does not handle again what a member with it
	// on completed. In transactional mode, outputs stay exactly once either way.
	DisableCompletedTail bool

	// TailMetadataBudget bounds the commit metadata in bytes. It must not
	// exceed the broker's offset.metadata.max.bytes (4096 by default), or
	// the broker rejects the commit: Subscribe reads that setting from the
	// group coordinator (DescribeConfigs) and fails with ErrInvalidConfig
	// when a budget set here is above it. A broker that does not report it,
	// or refuses to describe its config, is not judged (Subscribe logs it).
	// When the tail does not fit, its longest fitting prefix is kept.
	// Default frontier.DefaultMetadataBudget, or the coordinator's
	// offset.metadata.max.bytes when that is lower.
	TailMetadataBudget int

	// PauseAtTailUsage, between 0 and 1, pauses taking records from a
	// partition while its encoded tail uses at least this fraction of
	// TailMetadataBudget (or no longer fits), as Confluent's Parallel
	// Consumer does at 0.75, so that a slow head cannot make records
	// completed behind it unrecorded. Zero (the default) never pauses: the
	// tail is then truncated gracefully and only what does not fit may be
	// handled twice after a crash.
	//
	// The pause follows the tail as records complete, not only at commits:
	// a cheap bound on the tail's encoded size (from the number of completed
	// ranges and the offsets they span) is checked after completions, and
	// once it reaches the fraction the tail is encoded at once to measure
	// it. From the moment the tail measures at or above the fraction, the
	// partition takes no further record, however fast records arrive;
	// records taken before then (handed out, or among the few dozen ready)
	// still run, and their completions can grow the tail further: a fraction
	// below one leaves them room. The partition resumes once the tail
	// measures below the fraction again: at once when the bound shows it,
	// else at the next commit interval's encoding. Stats reports Paused and
	// PausedFor.
	PauseAtTailUsage float64

	// Observer, when set, is told of every delivery and its outcome and of
	// every commit, for tracing (see Observer and package
	// github.com/safeack/safeack/otel). Nil costs nothing.
	Observer Observer
}

// Ordering selects how much of a partition's order a Subscriber keeps.
type Ordering int

const (
	// OrderByKey runs records with different keys concurrently and records
	// with the same key one at a time, started in offset order. Records
	// with an empty or nil key are ordered among themselves, one at a time
	// per partition in offset order, as under OrderByPartition and in
	// watermill-kafka (whose DefaultMarshaler sets no key); they run
	// beside keyed records. Use Unordered, or an OrderingKey that returns
	// distinct keys, to run key-less records concurrently.
	OrderByKey Ordering = iota
	// OrderByPartition keeps at most one record of a partition in flight,
	// as watermill-kafka's subscriber does.
	OrderByPartition
	// Unordered lets any record run beside any other, up to the bounds.
	Unordered
)

// String names the ordering mode.
func (o Ordering) String() string {
	switch o {
	case OrderByKey:
		return "by-key"
	case OrderByPartition:
		return "by-partition"
	case Unordered:
		return "unordered"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// DefaultSaramaSubscriberConfig returns the Sarama configuration a
// Subscriber uses when OverwriteSaramaConfig is nil: errors are returned to
// the subscriber, and the client identifies itself as safeack.
func DefaultSaramaSubscriberConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Consumer.Return.Errors = true
	c.ClientID = "safeack"
	return c
}

// withDefaults returns a copy of c with defaults applied, and a private
// copy of the Sarama config so the caller's value is never changed.
func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.OverwriteSaramaConfig == nil {
		c.OverwriteSaramaConfig = DefaultSaramaSubscriberConfig()
	} else {
		c.OverwriteSaramaConfig = kclient.CopySaramaConfig(c.OverwriteSaramaConfig)
	}
	if c.Unmarshaler == nil {
		c.Unmarshaler = kafka.DefaultMarshaler{}
	}
	if c.OTELEnabled && c.Tracer == nil {
		c.Tracer = kafka.NewOTELSaramaTracer()
	}
	if c.NackResendSleep == 0 {
		c.NackResendSleep = DefaultNackResendSleep
	}
	if c.ReconnectRetrySleep == 0 {
		c.ReconnectRetrySleep = DefaultReconnectRetrySleep
	}
	if c.WaitForTopicCreationTimeout == 0 {
		c.WaitForTopicCreationTimeout = 10 * time.Second
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxPendingPerPartition == 0 {
		c.MaxPendingPerPartition = DefaultMaxPendingPerPartition
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
		// Unset, it must not turn a valid Sarama config into an invalid
		// one (see Validate): half the rebalance timeout leaves the other
		// half for the final commit and the rejoin.
		if half := c.OverwriteSaramaConfig.Consumer.Group.Rebalance.Timeout / 2; c.ConsumerGroup != "" && half < c.DrainTimeout {
			c.DrainTimeout = half
		}
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
		if ac := c.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit; ac.Enable && ac.Interval > 0 {
			c.CommitInterval = ac.Interval
		}
	}
	if c.TailMetadataBudget == 0 {
		c.TailMetadataBudget = frontier.DefaultMetadataBudget
	}
	return c
}

// ErrInvalidConfig is wrapped by every error NewSubscriber returns for a
// configuration it refuses.
var ErrInvalidConfig = sentinel.ErrInvalidConfig

func fieldError(field, format string, args ...any) error {
	return sentinel.Field(field, format, args...)
}

// Validate reports the first invalid field of c, after defaults are
// applied. Each error wraps ErrInvalidConfig and names the field.
func (c SubscriberConfig) Validate() error {
	commitIntervalSet := c.CommitInterval != 0
	c = c.withDefaults()
	if len(c.Brokers) == 0 {
		return fieldError("Brokers", "no brokers given")
	}
	for i, b := range c.Brokers {
		if b == "" {
			return fieldError("Brokers", "entry %d is empty", i)
		}
	}
	if c.NackResendSleep < 0 && c.NackResendSleep != NoSleep {
		return fieldError("NackResendSleep", "negative duration %v", c.NackResendSleep)
	}
	if c.ReconnectRetrySleep < 0 && c.ReconnectRetrySleep != NoSleep {
		return fieldError("ReconnectRetrySleep", "negative duration %v", c.ReconnectRetrySleep)
	}
	if c.WaitForTopicCreationTimeout < 0 {
		return fieldError("WaitForTopicCreationTimeout", "negative duration %v", c.WaitForTopicCreationTimeout)
	}
	if c.MaxInFlight < 0 {
		return fieldError("MaxInFlight", "negative size %d", c.MaxInFlight)
	}
	if c.MaxPendingPerPartition < 0 {
		return fieldError("MaxPendingPerPartition", "negative size %d", c.MaxPendingPerPartition)
	}
	if c.DrainTimeout < 0 {
		return fieldError("DrainTimeout", "negative duration %v", c.DrainTimeout)
	}
	if ac := c.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit; !commitIntervalSet && ac.Enable && ac.Interval > 0 && ac.Interval < minCommitInterval {
		return fieldError("OverwriteSaramaConfig", "Consumer.Offsets.AutoCommit.Interval %v is below %v (with auto-commit on and CommitInterval unset it is safeack's commit interval): a commit takes a round trip to the broker, and the commit loop would only spin", ac.Interval, minCommitInterval)
	}
	if c.CommitInterval < 0 {
		return fieldError("CommitInterval", "negative duration %v", c.CommitInterval)
	}
	if c.CommitInterval > 0 && c.CommitInterval < minCommitInterval {
		return fieldError("CommitInterval", "%v is below %v: a commit takes a round trip to the broker, and the commit loop would only spin", c.CommitInterval, minCommitInterval)
	}
	if c.TailMetadataBudget < 0 {
		return fieldError("TailMetadataBudget", "negative size %d", c.TailMetadataBudget)
	}
	if c.PauseAtTailUsage < 0 || c.PauseAtTailUsage > 1 || c.PauseAtTailUsage != c.PauseAtTailUsage {
		return fieldError("PauseAtTailUsage", "%v is not a fraction between 0 and 1", c.PauseAtTailUsage)
	}
	switch c.Ordering {
	case OrderByKey, OrderByPartition, Unordered:
	default:
		return fieldError("Ordering", "unknown mode %d", int(c.Ordering))
	}
	if c.OrderingKey != nil && c.Ordering != OrderByKey {
		return fieldError("OrderingKey", "set, but Ordering is %v; it applies only to OrderByKey", c.Ordering)
	}
	if err := c.OverwriteSaramaConfig.Validate(); err != nil {
		return fieldError("OverwriteSaramaConfig", "%v", err)
	}
	if err := c.validateGroupProtocol(); err != nil {
		return err
	}
	if c.ConsumerGroup != "" {
		// Sarama refuses it only when the consumer group is made, after
		// Subscribe returned: the subscription would reconnect forever.
		// The consumer protocol sends no request of Sarama's: franz-go
		// agrees each request's version with the broker.
		if v := c.OverwriteSaramaConfig.Version; !v.IsAtLeast(sarama.V0_10_2_0) && c.GroupProtocol != GroupProtocolConsumer {
			return fieldError("OverwriteSaramaConfig.Version", "%s: consumer groups need %s or later", v, sarama.V0_10_2_0)
		}
		if rt := c.OverwriteSaramaConfig.Consumer.Group.Rebalance.Timeout; c.DrainTimeout >= rt {
			return fieldError("DrainTimeout", "%v must be below Consumer.Group.Rebalance.Timeout (%v), or a draining member is expelled from the group", c.DrainTimeout, rt)
		}
	}
	return nil
}

// minCommitInterval is the shortest commit interval accepted, here and in
// TxnConfig.
const minCommitInterval = time.Millisecond

// autoCommitIntervalUnused reports, for a config whose CommitInterval was
// set (raw), Sarama's auto-commit interval that CommitInterval overrides:
// a value other than Sarama's default, which the caller therefore chose.
func autoCommitIntervalUnused(raw SubscriberConfig, sc *sarama.Config) (time.Duration, bool) {
	ac := sc.Consumer.Offsets.AutoCommit
	if raw.CommitInterval == 0 || !ac.Enable || ac.Interval == raw.CommitInterval || ac.Interval == sarama.NewConfig().Consumer.Offsets.AutoCommit.Interval {
		return 0, false
	}
	return ac.Interval, true
}

// options is what the subscriptions need of c, whose defaults are
// applied, built once for a Subscriber (Uber's kafka-client calls it
// buildOptions): the partition workers' configuration among it (each
// subscription adds its log fields and a fresh seed for ordering keys).
// defaultTailBudget says TailMetadataBudget was
// left zero.
func (c *SubscriberConfig) options(logger watermill.LoggerAdapter, defaultTailBudget bool) consume.Options {
	ordering := partition.ByKey
	switch c.Ordering {
	case OrderByPartition:
		ordering = partition.ByPartition
	case Unordered:
		ordering = partition.Unordered
	}
	return consume.Options{
		Brokers:               c.Brokers,
		OverwriteSaramaConfig: c.OverwriteSaramaConfig,
		ConsumerGroup:         c.ConsumerGroup,
		ConsumerProtocol:      c.GroupProtocol == GroupProtocolConsumer,
		ServerAssignor:        string(c.RemoteAssignor),
		Tracer:                c.Tracer,
		MaxInFlight:           c.MaxInFlight,
		DrainTimeout:          c.DrainTimeout,
		ReconnectRetrySleep:   c.ReconnectRetrySleep,
		TailMetadataBudget:    c.TailMetadataBudget,
		DisableCompletedTail:  c.DisableCompletedTail,
		CommitEvery:           c.CommitInterval,
		DefaultTailBudget:     defaultTailBudget,
		ReportCommits:         c.Observer != nil,
		Logger:                logger,
		Worker: partition.Config{
			Ordering:         ordering,
			OrderingKey:      c.OrderingKey,
			Unmarshaler:      c.Unmarshaler,
			OnUnmarshalError: c.OnUnmarshalError,
			UnmarshalRetry:   max(c.ReconnectRetrySleep, 0),
			MaxPending:       c.MaxPendingPerPartition,
			NackResendSleep:  c.NackResendSleep,
			DrainTimeout:     c.DrainTimeout,
			CompletedTail:    !c.DisableCompletedTail,
			TailBudget:       c.TailMetadataBudget,
			PauseAtTailUsage: c.PauseAtTailUsage,
			Logger:           logger,
			Observer:         partitionObserver(c.Observer, c.ConsumerGroup),
		},
	}
}
