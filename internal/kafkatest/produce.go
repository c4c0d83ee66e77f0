package kafkatest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/IBM/sarama"
)

// Record is one record to produce. Partition is explicit: tests decide where
// records land, so they know which offsets each partition must account for.
type Record struct {
	Partition int32
	Key       []byte // nil produces a null key
	Value     []byte
	Headers   map[string]string
}

// Produced is a record the broker acknowledged, with the offset it got.
type Produced struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   map[string]string
}

// String identifies the record as topic/partition@offset, for failure
// messages.
func (p Produced) String() string {
	return fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.Offset)
}

// Produce synchronously produces recs to topic, each to its own partition,
// and returns them with their offsets, in the order given. They are also
// remembered for ProducedRecords.
func (c *Cluster) Produce(tb testing.TB, topic string, recs ...Record) []Produced {
	tb.Helper()
	if len(recs) == 0 {
		return nil
	}
	p := c.syncProducer(tb)
	msgs := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		m := &sarama.ProducerMessage{Topic: topic, Partition: r.Partition}
		// A nil Encoder, not an empty ByteEncoder, is what makes a null
		// key/value on the wire.
		if r.Key != nil {
			m.Key = sarama.ByteEncoder(r.Key)
		}
		if r.Value != nil {
			m.Value = sarama.ByteEncoder(r.Value)
		}
		for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(r.Headers[k])})
		}
		msgs[i] = m
	}
	if err := p.SendMessages(msgs); err != nil {
		var perrs sarama.ProducerErrors
		if errors.As(err, &perrs) && len(perrs) > 0 {
			tb.Fatalf("kafkatest: producing to %s: %d of %d records failed, first: partition %d: %v",
				topic, len(perrs), len(msgs), perrs[0].Msg.Partition, perrs[0].Err)
		}
		tb.Fatalf("kafkatest: producing to %s: %v", topic, err)
	}
	out := make([]Produced, len(recs))
	for i, r := range recs {
		out[i] = Produced{
			Topic:     topic,
			Partition: msgs[i].Partition,
			Offset:    msgs[i].Offset,
			Key:       r.Key,
			Value:     r.Value,
			Headers:   maps.Clone(r.Headers),
		}
	}
	c.mu.Lock()
	c.produced[topic] = append(c.produced[topic], out...)
	c.mu.Unlock()
	return out
}

// ProduceN produces n records to topic, record i to partition i%partitions
// with key keyFn(i) (a null key when keyFn is nil), and returns each record's
// partition, offset, key and value in the order of i. Values are unique across
// the Cluster ("rec-<sequence>"), so a consumer that only sees the payload can
// still tell which produced record it got.
func (c *Cluster) ProduceN(tb testing.TB, topic string, partitions, n int, keyFn func(i int) string) []Produced {
	tb.Helper()
	if partitions < 1 {
		tb.Fatalf("kafkatest: ProduceN: %d partitions", partitions)
	}
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{
			Partition: int32(i % partitions),
			Value:     fmt.Appendf(nil, "rec-%d", c.seq.Add(1)),
		}
		if keyFn != nil {
			recs[i].Key = []byte(keyFn(i))
		}
	}
	return c.Produce(tb, topic, recs...)
}

// ProducedRecords returns every record this Cluster's Produce and ProduceN
// wrote to topic, in the order they were acknowledged per call.
func (c *Cluster) ProducedRecords(topic string) []Produced {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.produced[topic])
}

// ForgetProduced drops the records of topic/partition below offset from
// what ProducedRecords returns: for records the broker removed on purpose
// (compaction), which no consumer can get.
func (c *Cluster) ForgetProduced(topic string, partition int32, below int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.produced[topic] = slices.DeleteFunc(c.produced[topic], func(p Produced) bool {
		return p.Partition == partition && p.Offset < below
	})
}
