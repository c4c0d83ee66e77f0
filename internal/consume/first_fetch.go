package consume

import (
	"fmt"

	"github.com/IBM/sarama"
)

// What an early fetch asks a leader for: firstFetchBudget shared by its
// partitions, each between firstFetchMinBytes and firstFetchMaxBytes (and
// at most Consumer.Fetch.Default). Enough to keep handlers busy through
// Sarama's 100 ms wait at a few hundred thousand small records a second;
// small enough to decode in a few milliseconds. Sarama fetches the same
// records again, so more would be read twice.
const (
	firstFetchBudget   = 2 << 20
	firstFetchMinBytes = 64 << 10
	firstFetchMaxBytes = 1 << 20
)

// firstFetch is one partition's early fetch (see subscription.fetchFirstRecords).
type firstFetch struct {
	from    int64 // the offset fetched from
	records chan []*sarama.ConsumerMessage
}

// fetchFirstRecords fetches the first records of the given partitions of
// the subscription's topic, each from the offset in from, with one Fetch
// per partition leader sent at once, and returns a channel per partition
// that receives them.
//
// Sarama holds a consumer's first fetch from a broker back for 100 ms
// (partitionConsumersBatchTimeout, batching partitions that start
// together), at every session start; this fetch, sent in Setup, lets
// handlers start on records meanwhile. Sarama then fetches the same records
// again; the worker drops them (partition.Assignment.FirstRecords).
//
// It asks only for what Sarama would deliver the same way: records of the
// v2 format (Kafka 0.11 and later) at ReadUncommitted. Under ReadCommitted
// (the transactional mode), on older protocol versions, with a Tracer or
// Consumer.Interceptors (they must see every record once, on its way
// through the claim), or on any error, a partition gets no channel or
// nothing on it, and the claim delivers everything.
func (sub *subscription) fetchFirstRecords(client sarama.Client, from map[int32]int64) map[int32]*firstFetch {
	conf := client.Config()
	if len(from) == 0 || conf.Consumer.IsolationLevel != sarama.ReadUncommitted ||
		!conf.Version.IsAtLeast(sarama.V0_11_0_0) || sub.cfg.Tracer != nil || len(conf.Consumer.Interceptors) > 0 {
		return nil
	}
	topic := sub.topic
	// The goroutines below keep their own pointers: the caller owns the
	// returned map.
	type partFetch struct {
		partition int32
		*firstFetch
	}
	fetches := make(map[int32]*firstFetch, len(from))
	byLeader := make(map[*sarama.Broker][]partFetch)
	for p, off := range from {
		leader, err := client.Leader(topic, p)
		if err != nil {
			continue // the claim finds the leader itself
		}
		ff := &firstFetch{from: off, records: make(chan []*sarama.ConsumerMessage, 1)}
		fetches[p] = ff
		byLeader[leader] = append(byLeader[leader], partFetch{p, ff})
	}
	for leader, parts := range byLeader {
		maxBytes := min(conf.Consumer.Fetch.Default, firstFetchMaxBytes, max(firstFetchBudget/int32(len(parts)), firstFetchMinBytes))
		go func() {
			req := &sarama.FetchRequest{
				Version:      fetchVersion(conf.Version),
				MinBytes:     1,
				MaxWaitTime:  0, // whatever is there now
				MaxBytes:     conf.Consumer.Fetch.MaxBytes,
				Isolation:    sarama.ReadUncommitted,
				SessionID:    0,
				SessionEpoch: -1, // no fetch session (KIP-227), as Sarama's consumer
			}
			for _, pf := range parts {
				req.AddBlock(topic, pf.partition, pf.from, maxBytes, -1)
			}
			resp, err := leader.Fetch(req)
			for _, pf := range parts {
				var recs []*sarama.ConsumerMessage
				if err == nil {
					recs, _ = firstRecords(resp.GetBlock(topic, pf.partition), topic, pf.partition, pf.from)
				}
				pf.records <- recs
			}
		}()
	}
	return fetches
}

// firstRecords turns a Fetch response block into the messages Sarama's
// partition consumer would deliver from offset from at ReadUncommitted:
// the records of complete v2 batches at or after from, control batches
// (transaction markers) left out, timestamps as Sarama sets them. It stops
// at a partial trailing batch and refuses what it does not expect (an
// error code, the legacy message format, offsets not increasing) with an
// error and no records, leaving the partition to the claim.
func firstRecords(block *sarama.FetchResponseBlock, topic string, partition int32, from int64) ([]*sarama.ConsumerMessage, error) {
	if block == nil {
		return nil, fmt.Errorf("no block for %s/%d", topic, partition)
	}
	if block.Err != sarama.ErrNoError {
		return nil, block.Err
	}
	var out []*sarama.ConsumerMessage
	next := from
	for _, set := range block.RecordsSet {
		batch := set.RecordBatch
		if batch == nil {
			return nil, fmt.Errorf("%s/%d: legacy message format", topic, partition)
		}
		if batch.PartialTrailingRecord {
			break
		}
		if batch.Control {
			continue
		}
		for _, rec := range batch.Records {
			offset := batch.FirstOffset + rec.OffsetDelta
			if offset < next {
				if offset < from {
					continue // the batch starts before the fetch offset
				}
				return nil, fmt.Errorf("%s/%d: offset %d after %d", topic, partition, offset, next-1)
			}
			ts := batch.FirstTimestamp.Add(rec.TimestampDelta)
			if batch.LogAppendTime {
				ts = batch.MaxTimestamp
			}
			out = append(out, &sarama.ConsumerMessage{
				Topic:     topic,
				Partition: partition,
				Key:       rec.Key,
				Value:     rec.Value,
				Offset:    offset,
				Timestamp: ts,
				Headers:   rec.Headers,
			})
			next = offset + 1
		}
	}
	return out, nil
}

// fetchVersion is the Fetch request version Sarama's consumer uses for
// Kafka version v (from 0.11, the first with the v2 record format).
func fetchVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 12
	case v.IsAtLeast(sarama.V2_3_0_0):
		return 11
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 10
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 8
	case v.IsAtLeast(sarama.V1_1_0_0):
		return 7
	case v.IsAtLeast(sarama.V1_0_0_0):
		return 6
	default:
		return 5
	}
}
