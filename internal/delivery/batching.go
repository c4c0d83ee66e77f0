package delivery

// Batchable is what a batching handler asks of a delivery, besides the
// Delivery contract: when to stop collecting (the assignment ends), and
// how many messages the subscription can have out at once, so that a
// batch holding all of them is flushed instead of waiting for one more.
// Both subscriber modes implement it.
type Batchable interface {
	// Ending returns a channel that closes once AssignmentEnded turns
	// true.
	Ending() <-chan struct{}
	// HandOutPool returns a comparable value that identifies the
	// deliveries sharing the subscription's in-flight bound (one
	// Subscribe call), and that bound (MaxInFlight).
	HandOutPool() (pool any, maxInFlight int)
}
