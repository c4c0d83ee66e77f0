package share

import (
	"slices"
	"testing"
	"time"
)

// t0 is the fake clock's start.
var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

const testLock = 4 * time.Second

// polled returns n records polled at t0 with a 4 s lock, handed out
// (handedOut of them, the first ones) or waiting, at delivery count 1.
func polled(n, handedOut int) []lockView {
	recs := make([]lockView, n)
	for i := range recs {
		recs[i] = lockView{handedOut: i < handedOut, renewAt: t0.Add(testLock / 2), deliveryCount: 1}
	}
	return recs
}

func count(actions []lockAction, a lockAction) int {
	n := 0
	for _, x := range actions {
		if x == a {
			n++
		}
	}
	return n
}

// Before their renewal point, records are left alone, handed out or not:
// a fast subscription never renews nor gives back.
func TestPlanLocksBeforeRenewalPointKeepsAll(t *testing.T) {
	recs := polled(16, 4)
	got := planLocks(t0.Add(testLock/2-time.Millisecond), recs, 0, 5)
	if count(got, lockKeep) != len(recs) {
		t.Fatalf("actions %v, want every record kept", got)
	}
}

// A record whose lock's length is unknown (zero renewAt) is never renewed
// nor given back.
func TestPlanLocksUnknownLockKeeps(t *testing.T) {
	got := planLocks(t0.Add(time.Hour), []lockView{{}, {handedOut: true}}, 0, 5)
	if !slices.Equal(got, []lockAction{lockKeep, lockKeep}) {
		t.Fatalf("actions %v, want both kept", got)
	}
}

// Renew: every record a handler holds is renewed at its renewal point,
// whatever the hand-out pace (a long handler keeps its record; the drain
// at close waits with its records' locks renewed).
func TestPlanLocksRenewsHandedOut(t *testing.T) {
	recs := polled(8, 8)
	got := planLocks(t0.Add(testLock/2), recs, 0, 5)
	if count(got, lockRenew) != 8 {
		t.Fatalf("actions %v, want all 8 renewed", got)
	}
}

// Give back: the stuck member of issue 42. Handlers hang on the 4 records
// handed out; 12 more wait. At the renewal point the member handed out 4
// within the last half lock: the 4 handed out and the next 4 waiting are
// renewed (about to be handed out at that pace), the other 8 given back.
// Half a lock later, with nothing handed out since, the 4 kept ones go
// back too: every record not handed out is back with the group within one
// lock of its poll, and the handed-out ones keep their locks.
func TestPlanLocksStuckMemberGivesBack(t *testing.T) {
	recs := polled(16, 4)
	now := t0.Add(testLock / 2)
	got := planLocks(now, recs, 4, 5)
	want := slices.Repeat([]lockAction{lockRenew}, 8)
	want = append(want, slices.Repeat([]lockAction{lockGiveBack}, 8)...)
	if !slices.Equal(got, want) {
		t.Fatalf("first renewal point: actions %v, want %v", got, want)
	}

	// What the loop does: renewed records get their next renewal point,
	// given-back ones leave the member.
	var next []lockView
	for i, a := range got {
		if a == lockRenew {
			r := recs[i]
			r.renewAt = now.Add(testLock / 2)
			next = append(next, r)
		}
	}
	now = now.Add(testLock / 2)
	got = planLocks(now, next, 0, 5)
	want = []lockAction{lockRenew, lockRenew, lockRenew, lockRenew, lockGiveBack, lockGiveBack, lockGiveBack, lockGiveBack}
	if !slices.Equal(got, want) {
		t.Fatalf("second renewal point: actions %v, want %v", got, want)
	}
	if now.Sub(t0) > testLock {
		t.Fatalf("last give-back at %v after the poll, past one lock", now.Sub(t0))
	}
}

// Hand-out order: "about to" counts only records waiting ahead, not those
// handed out nor those not yet due (which still wait ahead), and a record
// given back no longer counts as ahead of the next.
func TestPlanLocksAboutToCountsWaitingAhead(t *testing.T) {
	due, later := t0, t0.Add(time.Second)
	recs := []lockView{
		{handedOut: true, renewAt: due, deliveryCount: 1},
		{renewAt: later, deliveryCount: 1}, // waiting, not due: ahead of the rest
		{renewAt: due, deliveryCount: 1},   // one ahead, pace 2: renewed
		{renewAt: due, deliveryCount: 1},   // two ahead: given back
		{renewAt: due, deliveryCount: 1},   // still two ahead: given back
	}
	got := planLocks(t0, recs, 2, 5)
	want := []lockAction{lockRenew, lockKeep, lockRenew, lockGiveBack, lockGiveBack}
	if !slices.Equal(got, want) {
		t.Fatalf("actions %v, want %v", got, want)
	}
}

// A record at its last delivery (MaxDeliveries) is never given back:
// back with the group it would come past MaxDeliveries, or be archived at
// the broker's limit, unhandled.
func TestPlanLocksKeepsLastDelivery(t *testing.T) {
	recs := polled(3, 0)
	recs[1].deliveryCount = 5
	got := planLocks(t0.Add(testLock/2), recs, 0, 5)
	want := []lockAction{lockGiveBack, lockRenew, lockGiveBack}
	if !slices.Equal(got, want) {
		t.Fatalf("actions %v, want %v", got, want)
	}
}

// Hand-out gate: a member polls while a handler is free, or one freed up
// within the last half lock; with every handler stuck for longer it does
// not acquire records only to give them back.
func TestMayPoll(t *testing.T) {
	half := testLock / 2
	for _, c := range []struct {
		name      string
		free      int
		lastFreed time.Time
		halfLock  time.Duration
		want      bool
	}{
		{"a handler free", 1, t0.Add(-time.Hour), half, true},
		{"no lock seen yet", 0, t0.Add(-time.Hour), 0, true},
		{"a handler freed recently", 0, t0.Add(-half + time.Millisecond), half, true},
		{"stuck for half a lock", 0, t0.Add(-half), half, false},
	} {
		if got := mayPoll(t0, c.free, c.lastFreed, c.halfLock); got != c.want {
			t.Errorf("%s: mayPoll = %v, want %v", c.name, got, c.want)
		}
	}
}

// The hand-out counter counts within a window, at the granularity of a
// renewCheck slot, and forgets what is older than it keeps.
func TestHandOutCounter(t *testing.T) {
	var c handOutCounter
	keep := 2 * time.Second
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for range 3 {
		c.add(at(0), keep)
	}
	c.add(at(50*time.Millisecond), keep) // same slot
	c.add(at(time.Second), keep)
	if got := c.since(at(time.Second), keep); got != 5 {
		t.Fatalf("since 2 s at 1 s: %d, want 5", got)
	}
	if got := c.since(at(time.Second), 500*time.Millisecond); got != 1 {
		t.Fatalf("since 0.5 s at 1 s: %d, want 1", got)
	}
	if got := c.since(at(10*time.Second), keep); got != 0 {
		t.Fatalf("since 2 s at 10 s: %d, want 0", got)
	}
	c.add(at(10*time.Second), keep)
	if len(c.slots) != 1 {
		t.Fatalf("slots kept after 10 s: %d, want 1 (older than %v forgotten)", len(c.slots), keep)
	}
	if got := c.since(at(10*time.Second), keep); got != 1 {
		t.Fatalf("since 2 s at 10 s: %d, want 1", got)
	}
}

// The pace of hand-outs decides the give-backs: a slow but moving
// subscription (a hand-out every 250 ms, records polled 16 at a time with
// a 4 s lock) keeps what it will hand out within the next half lock and
// gives back only the rest, and nothing once its backlog fits.
func TestPlanLocksSlowHandlersGiveBackOnlyTheSurplus(t *testing.T) {
	var c handOutCounter
	half := testLock / 2
	recs := polled(16, 0)
	handed := 0
	for now := t0; now.Before(t0.Add(half)); now = now.Add(250 * time.Millisecond) {
		recs[handed].handedOut = true
		handed++
		c.add(now, half)
	}
	now := t0.Add(half)
	got := planLocks(now, recs, c.since(now, half), 5)
	// 8 handed out (every 250 ms for 2 s), 8 waiting; 8 go out in the next 2 s.
	if handed != 8 || count(got, lockRenew) != 16 || count(got, lockGiveBack) != 0 {
		t.Fatalf("handed %d, actions %v: want all 16 renewed", handed, got)
	}
	recs = polled(32, 8)
	got = planLocks(now, recs, c.since(now, half), 5)
	if count(got, lockGiveBack) != 32-8-8 {
		t.Fatalf("actions %v: want the 16 beyond the next half lock's 8 hand-outs given back", got)
	}
}
