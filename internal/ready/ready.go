// Package ready tracks where each subscription of a subscriber stands
// (connecting, joining its group, consuming, fenced), for Ready and
// WaitReady.
package ready

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/safeack/safeack/internal/sentinel"
)

// Phase is where a subscription stands, for Ready.
type Phase int

const (
	// Connecting: no connection; the last one failed or ended.
	Connecting Phase = iota
	// Joining: connected, joining the consumer group (or
	// rebalancing): no assignment yet.
	Joining
	// Consuming: in a group session with its assignment; without a
	// consumer group, connected.
	Consuming
	// Fenced: the group member was fenced (ErrInstanceFenced); the
	// subscription has ended, and Ready reports it from then on (after
	// Close too).
	Fenced
)

type subStatus struct {
	topic string
	group string
	kind  string // "consumer group" or "share group"
	phase Phase
	err   error // what ended the last connection, in Connecting
}

// Tracker tracks the phase of every subscription of a subscriber.
type Tracker struct {
	mu   sync.Mutex
	subs map[any]*subStatus // by subscription
	// changed is closed, and replaced, at every change: WaitReady waits
	// on it instead of polling.
	changed chan struct{}
}

// Set records the phase of the subscription key, of topic in group (kind
// says what group: "consumer group" or "share group"), and err, what ended
// its last connection in Connecting (what fenced it in Fenced; what it
// waits for in Joining, or nil).
func (r *Tracker) Set(key any, topic, group, kind string, p Phase, err error) {
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

// Remove forgets an ended subscription, except a fenced one: Ready keeps
// telling why it ended.
func (r *Tracker) Remove(key any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.subs[key]; st != nil && st.phase == Fenced {
		return
	}
	delete(r.subs, key)
	r.notifyLocked()
}

func (r *Tracker) notifyLocked() {
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// Check returns a channel closed at the next change, and what Ready
// reports.
func (r *Tracker) Check() (<-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	if len(r.subs) == 0 {
		return r.changed, fmt.Errorf("%w: no subscription", sentinel.ErrNotReady)
	}
	var waiting []*subStatus
	for _, st := range r.subs {
		if st.phase != Consuming {
			waiting = append(waiting, st)
		}
	}
	if len(waiting) == 0 {
		return r.changed, nil
	}
	slices.SortFunc(waiting, func(a, b *subStatus) int { return cmp.Compare(a.topic, b.topic) })
	var why []string
	errs := []error{sentinel.ErrNotReady}
	for _, st := range waiting {
		switch {
		case st.phase == Fenced:
			why = append(why, fmt.Sprintf("topic %q: stopped: %v", st.topic, st.err))
			errs = append(errs, st.err)
		case st.phase == Joining && st.err != nil:
			why = append(why, fmt.Sprintf("topic %q: joining %s %q: %v", st.topic, st.kind, st.group, st.err))
		case st.phase == Joining:
			why = append(why, fmt.Sprintf("topic %q: joining %s %q", st.topic, st.kind, st.group))
		case st.err != nil:
			why = append(why, fmt.Sprintf("topic %q: reconnecting after: %v", st.topic, st.err))
		default:
			why = append(why, fmt.Sprintf("topic %q: connecting", st.topic))
		}
	}
	return r.changed, &notReadyError{msg: sentinel.ErrNotReady.Error() + ": " + strings.Join(why, "; "), errs: errs}
}

// ClosedErr is what Ready reports after Close: sentinel.ErrSubscriberClosed, and
// the fencing that ended a subscription before (a Watermill Router closes
// its subscribers once their channels closed).
func (r *Tracker) ClosedErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.subs {
		if st.phase == Fenced {
			return fmt.Errorf("%w after topic %q: %w", sentinel.ErrSubscriberClosed, st.topic, st.err)
		}
	}
	return sentinel.ErrSubscriberClosed
}

// notReadyError is what Ready reports: sentinel.ErrNotReady, and the errors that
// ended subscriptions for good (ErrInstanceFenced).
type notReadyError struct {
	msg  string
	errs []error
}

func (e *notReadyError) Error() string   { return e.msg }
func (e *notReadyError) Unwrap() []error { return e.errs }
