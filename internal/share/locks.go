package share

import "time"

// The member loop's decisions about acquisition locks, on plain values:
// which unanswered records to renew, which to give back to the group, and
// whether to poll. The loop (member.go) gathers the values and does the
// kgo I/O; nothing here reads a clock or a client.
//
// The broker's lock exists to move a record away from a consumer that
// cannot work on it. A record a handler holds keeps its lock (a long
// handler finishes its work); a record that waits in the member for a
// handler keeps it only while a handler is about to take it. Once it has
// waited half its lock (its renewal point) with no handler about to take
// it, it is released: another consumer can take it at once.

// lockView is what the decisions read of one unanswered record of a
// member.
type lockView struct {
	// handedOut: a handler holds the record's message, or a free handler
	// was taken for it.
	handedOut bool
	// renewAt is the record's renewal point: half of what was left of its
	// lock when it was polled, or half its renewed lock. Zero when the
	// lock's length is unknown: nothing is decided about the record.
	renewAt time.Time
	// deliveryCount is the record's share group delivery count.
	deliveryCount int32
}

// lockAction is what to do about one record's lock now.
type lockAction uint8

const (
	// lockKeep: nothing to do yet (before its renewal point, or its lock
	// unknown).
	lockKeep lockAction = iota
	// lockRenew: renew its lock (KIP-1222).
	lockRenew
	// lockGiveBack: release it to the group without handing it out.
	lockGiveBack
)

func (a lockAction) String() string {
	switch a {
	case lockRenew:
		return "renew"
	case lockGiveBack:
		return "give back"
	default:
		return "keep"
	}
}

// planLocks decides, at now, what to do about each of recs, a member's
// unanswered records in the order the member hands them out (those handed
// out first, then those waiting for a handler, in turn).
//
// A record past its renewal point is renewed when a handler holds it, or
// when it is about to be handed out: fewer records wait ahead of it than
// the member handed out during the last half lock (handedRecently), so at
// that pace a handler takes it before its renewed lock reaches its next
// renewal point. It is renewed too at its last delivery
// (deliveryCount >= lastDelivery, MaxDeliveries): given back, it would come
// back past MaxDeliveries, or be archived by the broker at its delivery
// limit, unseen. Any other record past its renewal point is given back.
func planLocks(now time.Time, recs []lockView, handedRecently, lastDelivery int) []lockAction {
	actions := make([]lockAction, len(recs))
	ahead := 0 // records waiting ahead of the current one
	for i, r := range recs {
		waiting := !r.handedOut
		switch {
		case r.renewAt.IsZero() || now.Before(r.renewAt):
			actions[i] = lockKeep
		case r.handedOut, ahead < handedRecently, int(r.deliveryCount) >= lastDelivery:
			actions[i] = lockRenew
		default:
			actions[i] = lockGiveBack
			waiting = false // no longer ahead of anything
		}
		if waiting {
			ahead++
		}
	}
	return actions
}

// mayPoll reports whether a member may poll for more records at now: a
// handler is free, or one freed up within the last half lock (halfLock,
// zero when no lock was seen yet). A member whose subscription's handlers
// are all stuck does not poll: what it acquired would wait half a lock,
// be given back, and cost its records a delivery attempt each, over and
// over.
func mayPoll(now time.Time, freeHandlers int, lastFreed time.Time, halfLock time.Duration) bool {
	return freeHandlers > 0 || halfLock <= 0 || now.Sub(lastFreed) < halfLock
}

// handOutCounter counts a member's hand-outs over recent time, in slots
// of renewCheck, for planLocks' handedRecently.
type handOutCounter struct {
	// slots are the non-empty slots, oldest first: the slot's number
	// (unix nanoseconds / renewCheck) and its hand-outs.
	slots []handOutSlot
}

type handOutSlot struct {
	slot int64
	n    int
}

func slotOf(t time.Time) int64 { return t.UnixNano() / int64(renewCheck) }

// add counts a hand-out at now, and forgets slots older than keep.
func (c *handOutCounter) add(now time.Time, keep time.Duration) {
	s := slotOf(now)
	if n := len(c.slots); n > 0 && c.slots[n-1].slot >= s {
		c.slots[n-1].n++ // same slot (or a clock step back: counted in the last)
	} else {
		c.slots = append(c.slots, handOutSlot{slot: s, n: 1})
	}
	oldest := slotOf(now.Add(-keep))
	drop := 0
	for drop < len(c.slots)-1 && c.slots[drop].slot < oldest {
		drop++
	}
	if drop > 0 {
		c.slots = append(c.slots[:0], c.slots[drop:]...)
	}
}

// since returns the hand-outs counted within window before now, at the
// granularity of a slot (the slot window begins in counts in full).
func (c *handOutCounter) since(now time.Time, window time.Duration) int {
	oldest := slotOf(now.Add(-window))
	n := 0
	for i := len(c.slots) - 1; i >= 0 && c.slots[i].slot >= oldest; i-- {
		n += c.slots[i].n
	}
	return n
}
