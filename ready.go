package safeack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrNotReady is wrapped by the errors Ready and WaitReady return while a
// subscription is not consuming.
var ErrNotReady = errors.New("safeack: not ready")

// phase is where a subscription stands, for Ready.
type phase int

const (
	// phaseConnecting: no connection; the last one failed or ended.
	phaseConnecting phase = iota
	// phaseJoining: connected, joining the consumer group (or
	// rebalancing): no assignment yet.
	phaseJoining
	// phaseConsuming: in a group session with its assignment; without a
	// consumer group, connected.
	phaseConsuming
	// phaseFenced: the group member was fenced (ErrInstanceFenced); the
	// subscription has ended, and Ready reports it from then on (after
	// Close too).
	phaseFenced
)

type subStatus struct {
	topic string
	group string
	kind  string // "consumer group" or "share group"
	phase phase
	err   error // what ended the last connection, in phaseConnecting
}

// readiness tracks the phase of every subscription of a Subscriber.
type readiness struct {
	mu   sync.Mutex
	subs map[any]*subStatus // by subscription: *subscription or *shareSubscription
	// changed is closed, and replaced, at every change: WaitReady waits
	// on it instead of polling.
	changed chan struct{}
}

func (r *readiness) set(sub *subscription, p phase, err error) {
	r.setKey(sub, sub.topic, sub.cfg.ConsumerGroup, "consumer group", p, err)
}

func (r *readiness) setKey(key any, topic, group, kind string, p phase, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subs == nil {
		r.subs = make(map[any]*subStatus)
	}
	st := r.subs[key]
	if st == nil {
		st = &subStatus{topic: topic, group: group, kind: kind}
		r.subs[key] = st
	}
	st.phase, st.err = p, err
	r.notifyLocked()
}

// remove forgets an ended subscription, except a fenced one: Ready keeps
// telling why it ended.
func (r *readiness) remove(sub *subscription) { r.removeKey(sub) }

func (r *readiness) removeKey(key any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.subs[key]; st != nil && st.phase == phaseFenced {
		return
	}
	delete(r.subs, key)
	r.notifyLocked()
}

func (r *readiness) notifyLocked() {
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// check returns a channel closed at the next change, and what Ready
// reports.
func (r *readiness) check() (<-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	if len(r.subs) == 0 {
		return r.changed, fmt.Errorf("%w: no subscription", ErrNotReady)
	}
	var waiting []*subStatus
	for _, st := range r.subs {
		if st.phase != phaseConsuming {
			waiting = append(waiting, st)
		}
	}
	if len(waiting) == 0 {
		return r.changed, nil
	}
	slices.SortFunc(waiting, func(a, b *subStatus) int { return cmp.Compare(a.topic, b.topic) })
	var why []string
	errs := []error{ErrNotReady}
	for _, st := range waiting {
		switch {
		case st.phase == phaseFenced:
			why = append(why, fmt.Sprintf("topic %q: stopped: %v", st.topic, st.err))
			errs = append(errs, st.err)
		case st.phase == phaseJoining:
			why = append(why, fmt.Sprintf("topic %q: joining %s %q", st.topic, st.kind, st.group))
		case st.err != nil:
			why = append(why, fmt.Sprintf("topic %q: reconnecting after: %v", st.topic, st.err))
		default:
			why = append(why, fmt.Sprintf("topic %q: connecting", st.topic))
		}
	}
	return r.changed, &notReadyError{msg: ErrNotReady.Error() + ": " + strings.Join(why, "; "), errs: errs}
}

// closedErr is what Ready reports after Close: ErrSubscriberClosed, and
// the fencing that ended a subscription before (a Watermill Router closes
// its subscribers once their channels closed).
func (r *readiness) closedErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.subs {
		if st.phase == phaseFenced {
			return fmt.Errorf("%w after topic %q: %w", ErrSubscriberClosed, st.topic, st.err)
		}
	}
	return ErrSubscriberClosed
}

// notReadyError is what Ready reports: ErrNotReady, and the errors that
// ended subscriptions for good (ErrInstanceFenced).
type notReadyError struct {
	msg  string
	errs []error
}

func (e *notReadyError) Error() string   { return e.msg }
func (e *notReadyError) Unwrap() []error { return e.errs }

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
		return s.ready.closedErr()
	}
	_, err := s.ready.check()
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
			return s.ready.closedErr()
		}
		changed, err := s.ready.check()
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
