package safeack

import (
	"context"
	"errors"

	"github.com/safeack/safeack/internal/sentinel"
)

// ErrNotReady is wrapped by the errors Ready and WaitReady return while a
// subscription is not consuming.
var ErrNotReady = sentinel.ErrNotReady

// Ready reports whether the Subscriber is consuming, for readiness probes.
// It returns nil when every subscription (every Subscribe call not yet
// ended) is connected to the cluster and, with a ConsumerGroup, is a member
// of the group's current generation holding its assignment. The
// assignment may be empty: a group can have more members than the topic
// has partitions. Otherwise it returns an error wrapping ErrNotReady that
// says, per topic, what the subscription is doing: joining the group (also
// during a rebalance), or connecting again after the error that ended its
// connection. A subscription fenced by another consumer with its
// Consumer.Group.InstanceId has ended for good: Ready reports it, wrapping
// ErrInstanceFenced as well, and still after Close beside
// ErrSubscriberClosed (a Watermill Router closes its subscribers once
// their channels closed). Before the first Subscribe it reports
// ErrNotReady, and after Close ErrSubscriberClosed.
//
// Ready does no I/O: it reports what the consumer last saw. With a
// ConsumerGroup, a broker that went away shows once Sarama notices (a
// failed heartbeat or fetch ends the group session). Without one, nothing
// ends the connection: Sarama's partition consumers retry (their errors
// are logged) and Ready stays nil. Nor does Ready tell a stuck partition
// (a rejected record, MaxPendingPerPartition reached, a tail budget
// pause): Stats does (Stuck, Paused, OldestUnfinishedAge). Subscribe
// itself fails when the first connection cannot be made.
func (s *Subscriber) Ready() error {
	if s.closed.Load() {
		return s.ready.ClosedErr()
	}
	_, err := s.ready.Check()
	return err
}

// WaitReady blocks until Ready reports nil and returns nil, or until ctx
// ends or the Subscriber is closed, and then returns the error Ready
// reports (joined with ctx's error). It returns at once what Ready reports
// when a subscription was fenced (ErrInstanceFenced): that never mends.
// Use it to start serving only once the subscriptions have their
// assignments, after router.Running() or after Subscribe.
func (s *Subscriber) WaitReady(ctx context.Context) error {
	for {
		if s.closed.Load() {
			return s.ready.ClosedErr()
		}
		changed, err := s.ready.Check()
		if err == nil || errors.Is(err, ErrInstanceFenced) {
			return err // a fenced subscription never becomes ready
		}
		select {
		case <-changed:
		case <-s.closing:
			return ErrSubscriberClosed
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		}
	}
}

// ErrInstanceFenced is wrapped by what Ready and WaitReady report, and by
// the Error logged, for a subscription whose consumer group member was
// fenced: another consumer joined the group with the same
// Consumer.Group.InstanceId (static membership), so the group coordinator
// gave it this member and its partitions and answers this one
// FENCED_INSTANCE_ID. The subscription stops for good: it hands nothing
// more out and commits nothing more (acks of the messages it handed out
// change nothing; the new member handles those records again), its channel
// closes, and it does not rejoin, since a rejoin would fence the other
// consumer in turn and the two would take the partitions from each other
// for as long as both run. Give each live consumer its own InstanceId.
var ErrInstanceFenced = sentinel.ErrInstanceFenced
