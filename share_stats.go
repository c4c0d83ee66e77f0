package safeack

import "time"

// ShareCounters count what happened to the records of one partition that a
// ShareSubscriber received, since it was made.
type ShareCounters struct {
	// Received counts records taken from the share group, redeliveries
	// included; Redelivered those with a delivery count above one.
	Received, Redelivered uint64
	// MaxDeliveryCount is the highest delivery count seen.
	MaxDeliveryCount int32
	// Accepted, Released and Rejected count the acknowledgements given:
	// ACCEPT (an Ack, a dead-lettered record, or one OnUnmarshalError
	// took), RELEASE (a Nack, Close, or a record given back: GivenBack)
	// and REJECT (RejectPoison, past MaxDeliveries, or an unmarshal
	// failure without OnUnmarshalError; written to the share group's
	// dead-letter topic by the broker when the group has one).
	Accepted, Released, Rejected uint64
	// DeadLettered counts records accepted after DeadLetter took them, or
	// after safeack.PoisonQueue published them.
	DeadLettered uint64
	// ReleasedAtClose counts records released because the subscription
	// ended before they were answered; SkippedClosing those whose handler
	// SkipRevoked did not run.
	ReleasedAtClose, SkippedClosing uint64
	// UnmarshalFailures counts records the Unmarshaler rejected.
	UnmarshalFailures uint64
	// Deferred counts completions deferred with Defer.
	Deferred uint64
	// LockRenewals counts acquisition lock renewals (KIP-1222) of records
	// whose answer took more than half their lock.
	LockRenewals uint64
	// GivenBack counts records released without being handed out: each
	// waited half its acquisition lock in the subscriber with no handler
	// about to take it (handlers stuck or slow), and went back to the
	// group for another consumer. Each cost the record a delivery attempt
	// at the broker. Zero while handlers keep up.
	GivenBack uint64
	// AckErrors counts partition acknowledgements the broker refused (for
	// example after the acquisition lock expired): their records are
	// delivered again; and acknowledgements given after the record's
	// acquisition lock ended, whatever the broker answered (it may have
	// given the record to another member, which handled it too).
	AckErrors uint64
}

// ShareStats is a snapshot of one partition a ShareSubscriber received
// records of.
type ShareStats struct {
	TopicPartition
	// InFlight counts messages handed out and not yet answered (a deferred
	// completion counts until it is resolved).
	InFlight int
	// OldestInFlight is the offset of the message handed out longest ago
	// and not answered, and OldestInFlightAge how long ago; valid when
	// InFlight > 0.
	OldestInFlight    int64
	OldestInFlightAge time.Duration
	ShareCounters
}

// Stats returns a snapshot of every partition the ShareSubscriber received
// records of, ordered by topic and partition. Counters sum over every
// subscription.
func (s *ShareSubscriber) Stats() []ShareStats {
	snap := s.stats.Snapshot()
	out := make([]ShareStats, len(snap))
	for i, st := range snap {
		out[i] = ShareStats{
			TopicPartition:    TopicPartition{Topic: st.Topic, Partition: st.Partition},
			InFlight:          st.InFlight,
			OldestInFlight:    st.OldestInFlight,
			OldestInFlightAge: st.OldestInFlightAge,
			ShareCounters:     ShareCounters(st.Counters),
		}
	}
	return out
}
