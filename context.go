package safeack

import (
	"context"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack/internal/delivery"
	"github.com/safeack/safeack/internal/share"
)

// recordFromCtx returns the Kafka record of a message delivered by a
// Subscriber or a ShareSubscriber.
func recordFromCtx(ctx context.Context) (*sarama.ConsumerMessage, bool) {
	d, ok := delivery.FromContext(ctx)
	if !ok {
		return nil, false
	}
	return d.Message(), true
}

// MessagePartitionFromCtx returns the Kafka partition of a message
// delivered by a Subscriber. It has the signature of watermill-kafka's
// function of the same name.
func MessagePartitionFromCtx(ctx context.Context) (int32, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return 0, false
	}
	return r.Partition, true
}

// MessagePartitionOffsetFromCtx returns the Kafka offset of a message
// delivered by a Subscriber.
func MessagePartitionOffsetFromCtx(ctx context.Context) (int64, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return 0, false
	}
	return r.Offset, true
}

// MessageTimestampFromCtx returns the Kafka timestamp of a message
// delivered by a Subscriber.
func MessageTimestampFromCtx(ctx context.Context) (time.Time, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return time.Time{}, false
	}
	return r.Timestamp, true
}

// MessageKeyFromCtx returns the Kafka key of a message delivered by a
// Subscriber.
func MessageKeyFromCtx(ctx context.Context) ([]byte, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return nil, false
	}
	return r.Key, true
}

// MessageTopicFromCtx returns the Kafka topic of a message delivered by a
// Subscriber.
func MessageTopicFromCtx(ctx context.Context) (string, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return "", false
	}
	return r.Topic, true
}

// MessageDeliveryCountFromCtx returns the share group delivery count of a
// message delivered by a ShareSubscriber: 1 at the first delivery, one more
// at each delivery after a release or an acquisition lock timeout.
func MessageDeliveryCountFromCtx(ctx context.Context) (int32, bool) {
	d, ok := share.FromContext(ctx)
	if !ok {
		return 0, false
	}
	return d.DeliveryCount(), true
}
