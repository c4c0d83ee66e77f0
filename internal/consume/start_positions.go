package consume

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// Where a partition starts: with a consumer group, at the group's commit
// (the first record fixes a start Sarama resolved from a sentinel), else
// at Consumer.Offsets.Initial resolved before Subscribe returns, or where
// the previous connection's completed prefix ended; a partition added
// after Subscribe starts at its first record. The early first fetch
// (first_fetch.go) and the backfill below a pinned start (backfill.go)
// start from what is decided here.

// initialOffset is where a partition without a commit (or a resume
// position) starts: Consumer.Offsets.Initial, or the log start for a
// partition added to the topic after Subscribe. At OffsetNewest (Sarama's
// default) such a partition's records would otherwise be skipped until the
// subscription noticed it (a consumer group rebalances on the next metadata
// refresh, Metadata.RefreshFrequency, 10 minutes by default).
func (sub *subscription) initialOffset(partition int32) int64 {
	if n := sub.firstPartitions; n > 0 && partition >= n {
		return sarama.OffsetOldest
	}
	return sub.cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial
}

// offsetLister lists the offsets at a position (sarama.OffsetNewest or
// sarama.OffsetOldest) of partitions of the subscription's topic, one
// request per leader, each partition tried again as a client tries a
// request; those without an answer are in errs.
type offsetLister interface {
	ListOffsets(partitions []int32, at int64) (offsets map[int32]int64, errs map[int32]error)
}

// initialStarts resolves initialOffset for the given partitions, with
// one listing per position asked for.
func (sub *subscription) initialStarts(client offsetLister, partitions []int32) (map[int32]int64, map[int32]error) {
	byInitial := make(map[int64][]int32, 1)
	for _, p := range partitions {
		at := sub.initialOffset(p)
		byInitial[at] = append(byInitial[at], p)
	}
	starts, errs := make(map[int32]int64, len(partitions)), make(map[int32]error)
	for at, ps := range byInitial {
		s, e := client.ListOffsets(ps, at)
		maps.Copy(starts, s)
		maps.Copy(errs, e)
	}
	return starts, errs
}

// resumePositions holds, without a consumer group, the completed prefix
// of each partition when its last connection ended, and before the first
// connection the start Subscribe resolved (see resolveFirstStarts). There
// is no commit to resume from; without these, a reconnect would start again
// at Consumer.Offsets.Initial: at OffsetNewest (Sarama's default) skipping
// the records unfinished at the end and those written meanwhile, at
// OffsetOldest handling the whole log again.
type resumePositions = lockedMap[int32, int64]

// resolveStart returns a partition consumer and the offset it starts at:
// where the partition's completed prefix ended on the previous connection,
// if any and still in the log, else Consumer.Offsets.Initial, resolved here
// so that the bookkeeping starts exactly where fetching does. Retention can
// move the log start between the two calls; the resolution is then retried.
func (sub *subscription) resolveStart(client sarama.Client, consumer sarama.Consumer, partition int32) (sarama.PartitionConsumer, int64, error) {
	initial := sub.initialOffset(partition)
	if at, ok := sub.resume.get(partition); ok {
		pc, err := consumer.ConsumePartition(sub.topic, partition, at)
		if err == nil {
			return pc, at, nil
		}
		if !errors.Is(err, sarama.ErrOffsetOutOfRange) {
			return nil, 0, fmt.Errorf("cannot consume partition %d from %d: %w", partition, at, err)
		}
		// Deleted (retention) below the log start: what is left from there
		// on was never handled. Above the end (a log truncated by an
		// unclean leader election): the end.
		initial = sarama.OffsetOldest
		if oldest, err := client.GetOffset(sub.topic, partition, sarama.OffsetOldest); err == nil && at > oldest {
			initial = sarama.OffsetNewest
		}
		sub.logger.Error("The partition's resume position is no longer in the log; starting at the log's start or end", err,
			sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "resume_offset": at, "start_at": offsetName(initial)}))
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var start int64
		start, err = client.GetOffset(sub.topic, partition, initial)
		if err != nil {
			return nil, 0, fmt.Errorf("cannot resolve the start offset of partition %d: %w", partition, err)
		}
		var pc sarama.PartitionConsumer
		pc, err = consumer.ConsumePartition(sub.topic, partition, start)
		if err == nil {
			return pc, start, nil
		}
		if !errors.Is(err, sarama.ErrOffsetOutOfRange) {
			break
		}
	}
	return nil, 0, fmt.Errorf("cannot consume partition %d: %w", partition, err)
}

// startPartition is resolveStart with the partition consumer wrapped by
// the Tracer, if there is one.
func (sub *subscription) startPartition(client sarama.Client, consumer sarama.Consumer, partition int32) (sarama.PartitionConsumer, int64, error) {
	pc, start, err := sub.resolveStart(client, consumer, partition)
	if err == nil && sub.cfg.Tracer != nil {
		pc = sub.cfg.Tracer.WrapPartitionConsumer(pc)
	}
	return pc, start, err
}

// resolveFirstStarts resolves Consumer.Offsets.Initial for every partition
// before Subscribe returns, as watermill-kafka does by starting its
// partition consumers there: at OffsetNewest, a record produced after
// Subscribe returned must not be skipped because the subscription's
// goroutine resolved the end of the log later. The first connection starts
// there (see resolveStart). A partition that cannot be resolved now is
// resolved when the connection starts, as before.
func (sub *subscription) resolveFirstStarts(client sarama.Client) {
	partitions, err := client.Partitions(sub.topic)
	if err != nil {
		sub.logger.Info("Cannot list the topic's partitions yet; their starts are resolved when consuming starts",
			sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		return
	}
	sub.firstPartitions = int32(len(partitions))
	// A partition the metadata names no leader for is not asked: asking
	// would refresh the metadata, with Sarama's retries, for each one.
	noLeader := leaderlessPartitions(client, sub.topic, partitions)
	starts, errs := sub.initialStarts(saramaReads{client: client, topic: sub.topic}, slices.DeleteFunc(slices.Clone(partitions), func(p int32) bool {
		return noLeader[p] != nil
	}))
	maps.Copy(errs, noLeader)
	for p, start := range starts {
		sub.resume.set(p, start)
	}
	for p, err := range errs {
		sub.logger.Info("Cannot resolve the partition's start yet; it is resolved when consuming starts",
			sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "err": err.Error()}))
	}
}

// logStartWithoutCommit says at Info, once per partition (the start is
// committed next, so the group has a commit from then on), where a
// partition on which the group has no commit starts and why: at
// OffsetNewest (Sarama's default) the records already in the partition
// are never handled by this group, which is what a newcomer who produced
// before the first run must see at once.
func (sub *subscription) logStartWithoutCommit(partition int32, start int64) {
	fields := watermill.LogFields{"kafka_partition": partition, "start_offset": start}
	switch {
	case sub.initialOffset(partition) != sub.cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial:
		sub.logger.Info("The group has no committed offset for this partition, added after Subscribe; it starts at the partition's oldest record",
			sub.logFields.Add(fields))
	case sub.initialOffset(partition) == sarama.OffsetOldest:
		sub.logger.Info("The group has no committed offset for this partition; it starts at its oldest record (Consumer.Offsets.Initial = OffsetOldest)",
			sub.logFields.Add(fields))
	default:
		sub.logger.Info("The group has no committed offset for this partition; it starts at the end of the log (Consumer.Offsets.Initial = OffsetNewest, Sarama's default): records produced before now are not handled by this group; set it to sarama.OffsetOldest to handle them",
			sub.logFields.Add(fields))
	}
}

func offsetName(o int64) string {
	if o == sarama.OffsetOldest {
		return "oldest"
	}
	return "newest"
}

// fetchStarts returns where Sarama's claims will fetch from, for the
// partitions whose group commit (read or pinned by Setup) says so.
func fetchStarts(claimed []int32, committed map[int32]kclient.CommittedOffset) map[int32]int64 {
	from := make(map[int32]int64, len(claimed))
	for _, p := range claimed {
		if c, ok := committed[p]; ok && c.Offset >= 0 {
			from[p] = c.Offset
		}
	}
	return from
}

// startOf tells where a claim starts. InitialOffset is the committed
// offset when Sarama fetches from it; it is the Consumer.Offsets.Initial
// sentinel when the group has no commit, or when its commit was out of range
// and Sarama fell back (Consumer.Group.ResetInvalidOffsets). Sarama does not
// expose the offset it then resolved, so the first record fixes the start
// (see fixStart) and, until one arrives, Stats shows the broker's current
// answer for the sentinel.
func (h *groupHandler) startOf(claim sarama.ConsumerGroupClaim) partition.Start {
	if off := claim.InitialOffset(); off >= 0 {
		return partition.Start{Offset: off, Resolved: true}
	}
	estimate, err := h.client.GetOffset(claim.Topic(), claim.Partition(), claim.InitialOffset())
	if err != nil {
		h.sub.logger.Debug("Cannot read the partition's start offset; Stats shows 0 until the first record",
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": claim.Partition(), "err": err.Error()}))
		estimate = 0
	}
	return partition.Start{Offset: estimate}
}
