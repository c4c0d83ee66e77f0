package safeack

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/IBM/sarama"
	"github.com/safeack/safeack/internal/partition"
)

// resolveStart resolves Consumer.Offsets.Initial of a partition to an offset
// and starts consuming there, so that the bookkeeping starts exactly where
// fetching does. Retention can move the log start between the two calls; the
// resolution is then retried.
func (sub *subscription) resolveStart(client sarama.Client, consumer sarama.Consumer, partition int32) (sarama.PartitionConsumer, int64, error) {
	initial := sub.cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial
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

// consumePartitions reads every partition of the topic without a group:
// nothing is committed.
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
	var wg sync.WaitGroup
	failed := make(chan error, len(partitions))
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, p := range partitions {
		pc, start, err := sub.resolveStart(client, consumer, p)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		if sub.cfg.Tracer != nil {
			pc = sub.cfg.Tracer.WrapPartitionConsumer(pc)
		}
		a := partition.Assignment{
			Topic:         sub.topic,
			Partition:     p,
			Start:         partition.Start{Offset: start, Resolved: true},
			Pauser:        consumer,
			HighWaterMark: pc.HighWaterMarkOffset,
		}
		if ff := sub.fetchFirstRecords(client, map[int32]int64{p: start})[p]; ff != nil {
			a.FirstRecords = ff.records
		}
		w, err := sub.newWorker(pctx, a)
		if err != nil {
			pc.Close()
			cancel()
			wg.Wait()
			return err
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for err := range pc.Errors() {
				sub.logger.Error("Partition consumer error", err, w.LogFields())
			}
		}()
		go func() {
			defer wg.Done()
			sub.subscriber.registry.attach(w)
			defer sub.subscriber.registry.detach(w)
			w.Run(pc.Messages(), sub.subscriber.closing)
			if err := pc.Close(); err != nil {
				failed <- err
			}
			cancel() // one partition ending ends this connection
		}()
	}
	wg.Wait()
	close(failed)
	return errors.Join(collect(failed)...)
}

func collect(ch <-chan error) []error {
	var errs []error
	for err := range ch {
		errs = append(errs, err)
	}
	return errs
}
