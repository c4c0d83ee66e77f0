package consume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/partition"
)

// consumePartitions reads every partition of the topic without a group:
// nothing is committed, and each partition's completed prefix at the end
// is where the next connection resumes it.
func (sub *subscription) consumePartitions(ctx context.Context, client sarama.Client) error {
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("cannot create consumer: %w", err)
	}
	if sub.cfg.Tracer != nil {
		consumer = sub.cfg.Tracer.WrapConsumer(consumer)
	}
	defer consumer.Close()
	partitions, err := consumer.Partitions(sub.topic)
	if err != nil {
		return fmt.Errorf("cannot list partitions of %q: %w", sub.topic, err)
	}
	c := &noGroupConsumer{sub: sub, client: client, consumer: consumer}
	c.ctx, c.cancel = context.WithCancel(ctx)
	defer c.cancel()
	// Start every partition first, so that their early fetch is one Fetch
	// per leader, as in a group session's Setup. A partition that cannot
	// start (no leader, or its leader does not answer) waits for its
	// leader while the others are consumed (see watchPartitions): ending
	// the connection for it stopped them all, and reconnected in a loop
	// for as long as the partition had no leader.
	starts := make([]started, 0, len(partitions))
	from := make(map[int32]int64, len(partitions))
	held := make(map[int32]*heldPartition)
	for _, p := range partitions {
		pc, start, err := c.tryStart(p)
		if err != nil {
			held[p] = &heldPartition{since: time.Now(), err: err}
			sub.logger.Info("Cannot start the partition; it waits until its leader answers",
				sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "err": err.Error()}))
			continue
		}
		starts = append(starts, started{p, pc, start})
		from[p] = start
	}
	first := sub.fetchFirstRecords(client, from)

	for i, s := range starts {
		var firstRecords <-chan []*sarama.ConsumerMessage
		if ff := first[s.partition]; ff != nil {
			firstRecords = ff.records
		}
		if err := c.start(s, firstRecords); err != nil {
			for _, r := range starts[i:] {
				r.pc.Close()
			}
			c.cancel()
			c.wg.Wait()
			return err
		}
	}
	c.wg.Go(c.listHighWaterMarks)
	running := make(map[int32]bool, len(partitions))
	for _, s := range starts {
		running[s.partition] = true
	}
	c.wg.Go(func() {
		if err := c.watchPartitions(sub.cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency, running, held); err != nil {
			c.fail(err)
			c.cancel()
		}
	})
	c.wg.Wait()
	return errors.Join(c.errs...)
}

// noGroupConsumer is one connection of a subscription without a consumer
// group: a worker for each partition of the topic, started by
// consumePartitions and by watchPartitions as partitions are added. One
// partition ending ends the connection.
type noGroupConsumer struct {
	sub      *subscription
	client   sarama.Client
	consumer sarama.Consumer
	// ctx is the workers' parent; cancel ends the connection.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the workers' goroutines and the consumer's own
	// workers are the running ones, whose high-water marks are listed
	// once per commit interval as in a group session.
	workers WorkerSet

	errsMu sync.Mutex
	errs   []error // ended the connection, for consumePartitions to return
}

// fail records an error that ends the connection.
func (c *noGroupConsumer) fail(err error) {
	c.errsMu.Lock()
	c.errs = append(c.errs, err)
	c.errsMu.Unlock()
}

// start starts the worker of one partition, and closes its partition
// consumer when the worker ends.
func (c *noGroupConsumer) start(s started, firstRecords <-chan []*sarama.ConsumerMessage) error {
	sub, p, pc := c.sub, s.partition, s.pc
	a := partition.Assignment{
		Topic:         sub.topic,
		Partition:     p,
		Start:         partition.Start{Offset: s.start, Resolved: true},
		Pauser:        c.consumer,
		HighWaterMark: pc.HighWaterMarkOffset,
		FirstRecords:  firstRecords,
	}
	w, err := sub.newWorker(c.ctx, a)
	if err != nil {
		return err
	}
	c.wg.Go(func() {
		for err := range pc.Errors() {
			sub.logger.Error("Partition consumer error", err, w.LogFields())
		}
	})
	c.wg.Go(func() {
		sub.host.Attach(w)
		defer sub.host.Detach(w)
		c.workers.Add(w)
		sub.leaders.started(w)
		w.Run(pc.Messages(), sub.host.Closing())
		sub.leaders.ended(w)
		c.workers.Remove(w)
		sub.resume.set(p, w.Stats().SafeOffset)
		if err := pc.Close(); err != nil {
			c.fail(err)
		}
		c.cancel() // one partition ending ends this connection
	})
	return nil
}

// listHighWaterMarks lists the running workers' high-water marks once per
// commit interval, for Stats, until the connection ends.
func (c *noGroupConsumer) listHighWaterMarks() {
	t := time.NewTicker(c.sub.cfg.CommitEvery)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		c.sub.leaders.listed(c.workers.setHighWaterMarks(saramaReads{client: c.client, topic: c.sub.topic}))
	}
}

// started is a partition consumer and the offset it starts at.
type started struct {
	partition int32
	pc        sarama.PartitionConsumer
	start     int64
}

// heldPartition is a partition of a connection without a consumer group
// that could not be started yet (see watchPartitions).
type heldPartition struct {
	since    time.Time // the first try
	err      error     // the last try's
	added    bool      // added to the topic while the connection ran
	reported bool      // logged, and listed by Subscriber.Unclaimed
}

// watchPartitions starts the partitions that could not be started yet
// (held: no leader, or a leader that does not answer), and those added to
// the topic while the connection runs. Without a group nothing else
// would: a group's session is rebalanced when Sarama sees the partition
// count change, checked every Metadata.RefreshFrequency (every; 0: never),
// and this checks as often. A held partition is tried again every
// claimCheckEvery with fresh metadata, and one not started within
// claimOverdueAfter of its first try is reported as a group's claim that
// cannot start is: an Error log, and Subscriber.Unclaimed until it starts
// or the connection ends. An error starting a worker ends the connection.
func (c *noGroupConsumer) watchPartitions(every time.Duration, running map[int32]bool, held map[int32]*heldPartition) error {
	sub, ctx, client := c.sub, c.ctx, c.client
	defer func() {
		for p, h := range held {
			if h.reported {
				sub.host.RemoveUnclaimed(sub, p)
			}
		}
	}()
	overdueAfter := claimOverdueAfter(sub.cfg.OverwriteSaramaConfig)
	t := time.NewTicker(claimCheckEvery)
	defer t.Stop()
	nextCount := time.Now().Add(every)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		count := every > 0 && !time.Now().Before(nextCount)
		if len(held) == 0 && !count {
			continue
		}
		if count {
			nextCount = time.Now().Add(every)
		}
		// Sarama keeps the answer when only leaders are missing.
		if err := client.RefreshMetadata(sub.topic); err != nil && !onlyLeadersMissing(err) {
			sub.logger.Debug("Cannot refresh the topic's partitions", sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
			continue
		}
		if count {
			if partitions, err := client.Partitions(sub.topic); err == nil {
				for _, p := range partitions {
					if !running[p] && held[p] == nil {
						held[p] = &heldPartition{since: time.Now(), added: true}
					}
				}
			}
		}
		for _, p := range slices.Sorted(maps.Keys(held)) {
			if ctx.Err() != nil {
				return nil
			}
			h := held[p]
			pc, start, err := c.tryStart(p)
			if err != nil {
				c.stillHeld(p, h, err, overdueAfter)
				continue
			}
			delete(held, p)
			running[p] = true
			fields := sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "kafka_initial_offset": start})
			if h.reported {
				sub.host.RemoveUnclaimed(sub, p)
			}
			if h.added {
				sub.logger.Info("Consuming a partition added to the topic", fields)
			} else {
				sub.logger.Info("The partition's leader answers; consuming it",
					fields.Add(watermill.LogFields{"waited": time.Since(h.since).Round(time.Millisecond).String()}))
			}
			if err := c.start(started{p, pc, start}, nil); err != nil {
				pc.Close()
				return err
			}
		}
	}
}

// tryStart starts partition p (see startPartition), unless the client's
// metadata names no leader for it: resolving its start would refresh the
// metadata, with Sarama's retries, and wait for each (seconds, which
// Close would wait for too).
func (c *noGroupConsumer) tryStart(p int32) (sarama.PartitionConsumer, int64, error) {
	if c.client.PartitionNotReadable(c.sub.topic, p) {
		return nil, 0, errNoLeader
	}
	return c.sub.startPartition(c.client, c.consumer, p)
}

// stillHeld records that a held partition failed to start again with
// err, and reports it once it is overdue.
func (c *noGroupConsumer) stillHeld(p int32, h *heldPartition, err error, overdueAfter time.Duration) {
	sub := c.sub
	fields := sub.logFields.Add(watermill.LogFields{"kafka_partition": p})
	if h.err == nil {
		// The first try of a partition added to the topic (its leader may
		// not be elected yet); consumePartitions logged the others'.
		sub.logger.Info("Cannot start a partition added to the topic yet; retrying", fields.Add(watermill.LogFields{"err": err.Error()}))
	}
	h.err = err
	if h.reported || time.Since(h.since) < overdueAfter {
		return
	}
	h.reported = true
	sub.host.AddUnclaimed(sub, Unclaimed{
		TopicPartition: TopicPartition{Topic: sub.topic, Partition: p},
		AssignedAt:     h.since,
		Since:          h.since,
		Err:            err,
	})
	sub.logger.Error("A partition of the topic is not consumed: it cannot start; waiting for its leader", err,
		fields.Add(watermill.LogFields{"waited": time.Since(h.since).Round(time.Millisecond).String()}))
}
