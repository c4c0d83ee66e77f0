package safeack

import (
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys set by KafkaMetadata. They match the log field names of
// watermill-kafka.
const (
	MetadataTopic     = "kafka_topic"
	MetadataPartition = "kafka_partition"
	MetadataOffset    = "kafka_partition_offset"
	MetadataKey       = "kafka_key"
)

// KafkaMetadata is router middleware that copies the Kafka topic,
// partition, offset and key (when not empty) of a message into its
// metadata, under MetadataTopic, MetadataPartition, MetadataOffset and
// MetadataKey, overwriting values of the same names (which, arriving from
// upstream, would describe another record; a key-less record's message
// has no MetadataKey). Placed outside
// PoisonQueue, it makes the dead-lettered copy say where the
// record came from. Partition and offset are decimal; the key is the raw
// bytes.
//
// Messages of any other subscriber pass through unchanged.
func KafkaMetadata(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if r, ok := recordFromCtx(msg.Context()); ok {
			if msg.Metadata == nil {
				msg.Metadata = make(message.Metadata)
			}
			msg.Metadata.Set(MetadataTopic, r.Topic)
			msg.Metadata.Set(MetadataPartition, strconv.FormatInt(int64(r.Partition), 10))
			msg.Metadata.Set(MetadataOffset, strconv.FormatInt(r.Offset, 10))
			if len(r.Key) > 0 {
				msg.Metadata.Set(MetadataKey, string(r.Key))
			} else {
				delete(msg.Metadata, MetadataKey) // an upstream record's
			}
		}
		return h(msg)
	}
}
