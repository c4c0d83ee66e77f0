package safeack

import (
	"context"
	"time"
)

// recordCtxKey is the context key under which a message's *record is kept.
// One key for all record facts keeps message creation to a single
// context.WithValue.
type recordCtxKey struct{}

func recordFromCtx(ctx context.Context) (*record, bool) {
	if ctx == nil {
		return nil, false
	}
	r, ok := ctx.Value(recordCtxKey{}).(*record)
	return r, ok
}

// MessagePartitionFromCtx returns the Kafka partition of a message
// delivered by a Subscriber. It has the signature of watermill-kafka's
// function of the same name.
func MessagePartitionFromCtx(ctx context.Context) (int32, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return 0, false
	}
	return r.msg.Partition, true
}

// MessagePartitionOffsetFromCtx returns the Kafka offset of a message
// delivered by a Subscriber.
func MessagePartitionOffsetFromCtx(ctx context.Context) (int64, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return 0, false
	}
	return r.msg.Offset, true
}

// MessageTimestampFromCtx returns the Kafka timestamp of a message
// delivered by a Subscriber.
func MessageTimestampFromCtx(ctx context.Context) (time.Time, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return time.Time{}, false
	}
	return r.msg.Timestamp, true
}

// MessageKeyFromCtx returns the Kafka key of a message delivered by a
// Subscriber.
func MessageKeyFromCtx(ctx context.Context) ([]byte, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return nil, false
	}
	return r.msg.Key, true
}

// MessageTopicFromCtx returns the Kafka topic of a message delivered by a
// Subscriber.
func MessageTopicFromCtx(ctx context.Context) (string, bool) {
	r, ok := recordFromCtx(ctx)
	if !ok {
		return "", false
	}
	return r.msg.Topic, true
}
