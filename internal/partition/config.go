package partition

import (
	"context"
	"hash/maphash"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
)

// Config is what the workers of one subscription share. It is read, never
// written, once workers use it.
type Config struct {
	Ordering Ordering
	// OrderingKey, with ByKey, replaces the record key as the ordering key.
	OrderingKey func(*sarama.ConsumerMessage) []byte
	// Seed hashes ordering keys.
	Seed maphash.Seed

	Unmarshaler Unmarshaler
	// OnUnmarshalError decides the fate of a record the Unmarshaler
	// rejects; nil keeps the partition waiting on it. It is retried after
	// UnmarshalRetry.
	OnUnmarshalError func(ctx context.Context, msg *sarama.ConsumerMessage, err error) error
	UnmarshalRetry   time.Duration

	// MaxPending bounds the records retained per partition.
	MaxPending      int
	NackResendSleep time.Duration
	DrainTimeout    time.Duration

	// CompletedTail writes the completed records behind the prefix into the
	// commit metadata, within TailBudget bytes. PauseAtTailUsage stops
	// taking records while the tail fills that fraction of the budget; zero
	// never. The records a previous owner's metadata lists are skipped
	// either way (see StartFromCommit): reading a tail is not writing one.
	CompletedTail    bool
	TailBudget       int
	PauseAtTailUsage float64

	Logger    watermill.LoggerAdapter
	LogFields watermill.LogFields

	// Observer, when set, is told of every delivery and its outcome.
	Observer Observer
}

// Ordering selects which records of a partition may run at the same time.
type Ordering int

const (
	// ByKey serializes records of one key (key-less ones in one lane).
	ByKey Ordering = iota
	// ByPartition runs the partition's records one at a time.
	ByPartition
	// Unordered runs any records at the same time.
	Unordered
)

// Unmarshaler turns Kafka records into Watermill messages, as
// watermill-kafka's Unmarshaler does.
type Unmarshaler interface {
	Unmarshal(*sarama.ConsumerMessage) (*message.Message, error)
}

// Start is where a partition's bookkeeping begins.
type Start struct {
	// Offset is where fetching starts when Resolved; otherwise the
	// broker's answer for Consumer.Offsets.Initial, an estimate that only
	// Stats shows until the first record arrives.
	Offset int64
	// Resolved says Offset is where Sarama fetches from: a committed,
	// in-range offset, or one resolved before ConsumePartition. When Sarama
	// resolved Consumer.Offsets.Initial itself (no commit, or a committed
	// offset out of range), the first record delivered fixes the start.
	Resolved bool
}

// Assignment is one partition given to a worker.
type Assignment struct {
	Topic     string
	Partition int32
	Start     Start
	// Marker takes the completed positions; nil without a consumer group:
	// nothing is marked (a drain still waits for answers: Stats'
	// SafeOffset is where the next connection resumes).
	Marker Marker
	// Pauser pauses fetching while records wait; nil never pauses.
	Pauser Pauser
	// HighWaterMark reports the claim's high-water mark, for Stats.
	HighWaterMark func() int64
	// RequestCommit asks for a commit soon: called when every record taken
	// is complete and none waits.
	RequestCommit func()
	// LeaderEpoch, when set and the completed tail is on, returns the
	// partition's leader epoch as the client's metadata names it now, or
	// -1 when unknown. Each mark carries it in its metadata
	// (frontier.AppendTailEpoch), for the next start to check the log
	// against (OffsetForLeaderEpoch, as Kafka's consumer does).
	LeaderEpoch func() int32
	// StartCommitted reads back whether the group's coordinator holds
	// offset for the partition. When set, a start fixed at the first record
	// (see Start) is committed again until it does, before anything is
	// handed out: Sarama does not report a refused commit. Nil: not checked.
	StartCommitted func(offset int64) bool
	// Deliveries, when set, is told of every delivery.
	Deliveries DeliveryHooks
	// FirstRecords, when not nil, may bring the partition's first records,
	// fetched from Start.Offset by the subscriber while Sarama holds its
	// own first fetch back (it batches new partitions for 100 ms). Run
	// takes them if they come before the claim's first record, and then
	// drops the claim's records below the last of them: the same records
	// fetched again. Once the claim delivered a record, they are ignored.
	// At most one value is sent; the channel needs a buffer of one.
	FirstRecords <-chan []*sarama.ConsumerMessage
	// PinStart: Start is resolved but the group has not committed it. Run
	// commits it before anything is handed out, as it does a start fixed
	// at the first record (and confirms it with StartCommitted), so that
	// the next owner resumes there even if this assignment ends before
	// its first record.
	PinStart bool
}

// Marker is where a worker's completed positions go: the part of a Sarama
// consumer-group session a partition needs, or the transactional mode's
// marker.
type Marker interface {
	MarkOffset(topic string, partition int32, offset int64, metadata string)
	ResetOffset(topic string, partition int32, offset int64, metadata string)
	Commit()
}

// Restarter is a Marker that keeps its own idea of what the group's commit
// covers (the transactional mode's). When Sarama fell back to
// Consumer.Offsets.Initial because the commit was out of range, the first
// record fixes the partition's real start (see Worker.fixStart), and the
// worker tells the marker, before it marks that start: from then on, what
// the commit covers is every offset below start and the records of tail
// (what the stale commit's completed tail still lists at or above start;
// empty when the commit was above start).
type Restarter interface {
	Restart(partition int32, start int64, tail frontier.Tail)
}

// Pauser pauses and resumes fetching of partitions: a Sarama consumer or
// consumer group.
type Pauser interface {
	Pause(map[string][]int32)
	Resume(map[string][]int32)
}

// Observer is told when each delivery starts and what became of it, for
// tracing. Nil costs nothing.
type Observer interface {
	// Started returns the context of the delivery msg of rec, derived
	// from ctx, and the delivery's state, passed back to Answered.
	Started(ctx context.Context, rec *sarama.ConsumerMessage, msg *message.Message) (context.Context, any)
	// Answered tells what became of the delivery whose state is given: a
	// deferred one is answered twice (Deferred when its handler defers it,
	// then Ack or Nack, with the resolution's error, once the router acked
	// it and the deferral is resolved, or Nack when the router nacks it).
	Answered(state any, o Outcome, err error)
}

// Outcome is what became of one delivery, for Observer.
type Outcome int

// Outcomes of a delivery.
const (
	OutcomeAck       Outcome = iota + 1 // the record completed
	OutcomeNack                         // the record is redelivered
	OutcomeSkipped                      // nacked by SkipIfEnded: left for the next owner
	OutcomeDeferred                     // its handler deferred its completion (Record.Defer)
	OutcomeAbandoned                    // the assignment ended before it was answered
)

// observe tells the Observer, if any, what became of a delivery.
func (w *Worker) observe(state any, o Outcome, err error) {
	if obs := w.cfg.Observer; obs != nil && state != nil {
		obs.Answered(state, o, err)
	}
}

// DeliveryHooks is told when each delivery starts and how it was answered:
// the transactional mode buffers a delivery's outputs with it and commits
// them only after the ack.
type DeliveryHooks interface {
	// Started returns the context of delivery msg, derived from ctx, and
	// the delivery's state, which the worker passes back to Acked or
	// Nacked: by then a middleware may have given msg a context not
	// derived from this one, so a hook must not look for its state there.
	Started(ctx context.Context, msg *message.Message) (context.Context, any)
	// Acked is called for an acked delivery before its record completes.
	Acked(rec *sarama.ConsumerMessage, msg *message.Message, state any)
	// Nacked is called for a nacked delivery.
	Nacked(msg *message.Message, state any)
}
