package safeack_test

import (
	"maps"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestKafkaMetadataOverwritesUpstream: KafkaMetadata describes the record
// that was delivered, whatever metadata arrived with it from upstream
// (watermill-kafka's DefaultMarshaler turns headers into metadata): a
// key-less record, which DefaultMarshaler publishes, carries no kafka_key
// of another record.
func TestKafkaMetadataOverwritesUpstream(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	c.Produce(t, topic, kafkatest.Record{Partition: 0, Value: []byte("v"), Headers: map[string]string{
		safeack.MetadataTopic: "upstream-topic", safeack.MetadataOffset: "99", safeack.MetadataKey: "upstream-key",
	}})
	sub := newTestSubscriber(t, c, "", nil)
	var m *message.Message
	select {
	case m = <-mustSubscribe(t, sub, topic):
	case <-time.After(mwWait):
		t.Fatal("no message")
	}
	defer m.Ack()
	var got message.Metadata
	_, err := safeack.KafkaMetadata(func(m *message.Message) ([]*message.Message, error) {
		got = maps.Clone(m.Metadata)
		return nil, nil
	})(m)
	require.NoError(t, err)
	assert.Equal(t, topic, got.Get(safeack.MetadataTopic))
	assert.Equal(t, "0", got.Get(safeack.MetadataOffset))
	_, hasKey := got[safeack.MetadataKey]
	assert.False(t, hasKey, "a key-less record carries the kafka_key of an upstream record: %q", got.Get(safeack.MetadataKey))
}
