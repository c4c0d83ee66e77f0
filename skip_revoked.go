package safeack

import (
	"github.com/ThreeDotsLabs/watermill/message"
)

// SkipRevoked is router middleware that does not run the handler for a
// message whose partition assignment ended (revoked in a rebalance, or the
// subscriber closing) after the message was delivered and before the
// handler started — for example while it waited in a throttling or
// concurrency-limiting middleware placed before SkipRevoked. Such a
// message is nacked without redelivery: nothing is acked for it, the
// committed offset stays before it, and the partition's next owner handles
// it. It is counted in SkippedRevoked (PartitionStats during the drain,
// Subscriber.Totals after it) and reported to Telemetry as OutcomeSkipped. Place it after (inside) any middleware that
// may delay the handler, and before (outside) any that does work.
//
// Messages of any other subscriber, and messages already acked or nacked,
// pass through unchanged.
func SkipRevoked(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if skipIfRevoked(msg) {
			// The message is nacked already; the router's Ack after a nil
			// return is a no-op, and nil keeps Retry and PoisonQueue out.
			return nil, nil
		}
		return h(msg)
	}
}
