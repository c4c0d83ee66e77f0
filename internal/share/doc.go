// Package share is the work behind a safeack ShareSubscriber: one
// subscription per Subscribe call, on a Kafka share group (KIP-932)
// through franz-go's kgo.
//
// Read it in this order. options.go: Options, the configuration built once
// from the public one; Host, the ShareSubscriber as a subscription sees it
// (closing, readiness, statistics); Observer, the tracing hooks.
// subscriber.go: Start connects the members (one kgo client each), Run
// polls, hands out, renews acquisition locks and waits for the answers,
// then drains, releases what is left and leaves the group. delivery.go:
// one record handed out, from the poll to its acknowledgement (accept,
// release or reject), with deferred completion and RejectPoison's
// rejection. observe.go: the acknowledgements waiting for the broker's
// answer. stats.go: the counters and the in-flight snapshot.
package share
