package share

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/ready"
)

// member is one member of the share group: a kgo client and the loop
// that polls it.
type member struct {
	sub    *Subscription
	id     int
	client *kgo.Client
	// coordinator is the broker that answered the last heartbeat (for
	// readyHook); hasCoordinator says one did.
	coordinator    atomic.Int32
	hasCoordinator atomic.Bool
	// acks are the acknowledgements waiting for the broker's answer, for
	// a ShareDeliveryObserver.
	acks ackWaits
	// renewals are the lock renewals waiting for the broker's answer.
	renewals renewalWaits
	// refusal is the authorization error of the member's last poll, nil
	// once a poll comes back without one: Ready reports it whatever the
	// heartbeats (whose refusals readyHook cannot see) say.
	refusal atomic.Pointer[error]
	// The member's share fetches (see fetchHook), under sentMu: sent holds
	// when the fetch in flight to each broker was written (a client has
	// one at most: it fetches when polled, and as a poll returns; see
	// member.buffer), answered when each
	// broker's last fetch answered since the member's last poll returned
	// was (unix nanoseconds).
	sentMu   sync.Mutex
	sent     map[int32]int64
	answered map[int32]int64
	// buffered are the records kgo buffered for the member's next poll
	// (under bufferedMu; see member.buffer).
	bufferedMu sync.Mutex
	buffered   []bufferedRecord
	// early are the records answered before a poll returned them: handed
	// out (takeEarly) or given back (giveBack) while kgo buffered them.
	// The member's goroutine only, as are handOuts and halfLock.
	early map[*kgo.Record]struct{}
	// assign follows whether the member holds partitions (assignment.go).
	assign assignWait
	// handOuts counts the member's recent hand-outs (planLocks);
	// halfLock is half the lock of the member's last delivery made.
	handOuts handOutCounter
	halfLock time.Duration
}

// run polls, hands out and waits until the poll's messages are answered
// (kgo accepts at the next poll what the last one left unanswered), until
// the subscription stops; then it drains and releases what is left.
func (m *member) run() {
	sub := m.sub
	renew := time.NewTicker(renewCheck)
	defer renew.Stop()
	for sub.stop.Err() == nil {
		if !sub.awaitHandler(m, renew.C) {
			break
		}
		pollStart := time.Now()
		fetches := m.client.PollRecords(sub.stop, -1) // all a fetch brought (see connect)
		fetched := m.fetchedFrom(pollStart)
		if fetches.IsClientClosed() || sub.stop.Err() != nil {
			sub.releaseRecords(fetches.Records())
			break
		}
		var refusal error
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if r := sub.authorizationError(err); r != nil {
				refusal, err = r, r
			}
			sub.logger.Error("Share fetch failed", err, watermill.LogFields{"partition": p, "member": m.id})
		})
		if refusal != nil {
			// It lasts until an ACL changes: Ready tells it.
			m.refusal.Store(&refusal)
			sub.host.SetPhase(m, sub.topic, ready.Connecting, refusal)
		} else if m.refusal.Swap(nil) != nil {
			p, err := m.phase(nil)
			sub.host.SetPhase(m, sub.topic, p, err)
		}
		batch := sub.take(m, fetches.Records(), fetched, renew.C)
		sub.handOut(m, batch, nil, renew.C)
		sub.await(m, batch, renew.C)
	}
}

// take turns a poll's records into deliveries. Records past
// MaxDeliveries without a DeadLetter, and records the Unmarshaler rejects
// without an OnUnmarshalError, are answered here and not handed out. The
// poll's locks are renewed meanwhile: a slow Unmarshaler holds the rest
// of the poll.
func (sub *Subscription) take(m *member, recs []*kgo.Record, fetched time.Time, renew <-chan time.Time) []*Delivery {
	polled := time.Now()
	buffered := m.takeBuffered(fetched)
	all := make([]*Delivery, 0, len(recs))
	for _, r := range recs {
		if _, ok := m.early[r]; ok {
			delete(m.early, r) // handed out while it waited (takeEarly), and answered
			continue
		}
		// The poll returns what kgo buffered, in order; kgo may have
		// left a record out (a partition no longer the member's).
		for len(buffered) > 0 && buffered[0].rec != r {
			buffered = buffered[1:]
		}
		var d *Delivery
		if len(buffered) > 0 {
			d, buffered = buffered[0], buffered[1:]
		} else {
			d = sub.newDelivery(m, r, fetched, polled)
		}
		if d.status.Load() != 0 {
			continue // given back while kgo buffered it (renewHeld)
		}
		all = append(all, d)
	}
	return sub.prepareAll(m, all, nil, renew)
}

// prepareAll counts the deliveries as received and prepares them (see
// prepare), renewing meanwhile their locks and those of held; it returns
// those to hand out.
func (sub *Subscription) prepareAll(m *member, all, held []*Delivery, renew <-chan time.Time) []*Delivery {
	batch := make([]*Delivery, 0, len(all))
	for _, d := range all {
		sub.received(d)
	}
	for _, d := range all {
		select {
		case now := <-renew:
			sub.renewHeld(m, now, held, all)
		default:
		}
		if d.status.Load() != 0 {
			continue // given back meanwhile (renewHeld)
		}
		if sub.prepare(d) {
			batch = append(batch, d)
		}
	}
	return batch
}

// takeEarly hands out the records kgo buffered while the member waits for
// its poll's messages to be answered (see member.buffer), as handlers free
// up, instead of leaving them until the member's next poll: that poll
// waits for the member's slowest handler. It cannot poll them sooner: a
// poll accepts every record of the previous one still unanswered. It
// returns the deliveries handed out, for the member to wait for as for its
// poll's (the poll that returns them from kgo's buffer skips them, see
// take); held are the poll's deliveries still unanswered, renewed
// meanwhile.
func (sub *Subscription) takeEarly(m *member, held []*Delivery, renew <-chan time.Time) []*Delivery {
	waiting := m.takeBuffered(m.lastFetchSent(time.Now()))
	waiting = slices.DeleteFunc(waiting, func(d *Delivery) bool { return d.status.Load() != 0 }) // given back
	if len(waiting) == 0 {
		return nil
	}
	for _, d := range waiting {
		m.markEarly(d)
	}
	batch := sub.prepareAll(m, waiting, held, renew)
	sub.handOut(m, batch, held, renew)
	return batch
}

// handOut sends the batch's messages, each once a handler is free (see
// Subscription.handlers), renewing meanwhile the acquisition locks of the
// batch's records that take long: the records not yet sent wait here while
// the handlers work on earlier ones, their locks running. A record whose
// lock ends (or is about to) before it is sent is released, never handed
// out: the broker may have given it to another member. On stop, the ones
// not sent are released.
func (sub *Subscription) handOut(m *member, batch, held []*Delivery, renew <-chan time.Time) {
	// The margin leaves a renewal the time to reach the broker.
	margin := renewCheck + sub.cfg.AckFlushInterval
	for i, d := range batch {
		if d.status.Load() != 0 {
			continue // given back while it waited (renewHeld)
		}
		if d.expired(time.Now(), margin) {
			d.finish(kgo.AckRelease, LockExpired)
			continue
		}
		if d.unmarshalErr != nil {
			sub.track(d)
			go d.unmarshalFailed()
			continue
		}
		if d.pastMax {
			sub.track(d)
			go d.giveUp()
			continue
		}
		if !sub.send(m, d, batch, held, renew, margin) {
			if sub.stop.Err() == nil {
				continue // its lock ended, or it was given back, first
			}
			for _, rest := range batch[i:] {
				rest.finish(kgo.AckRelease, ReleasedAtClose)
			}
			return
		}
	}
}

// send hands d's message out once a handler is free. It reports false
// when it did not: d's lock ended first (d released), d was given back
// (renewHeld), or the subscription stopped (d left to the caller).
func (sub *Subscription) send(m *member, d *Delivery, batch, held []*Delivery, renew <-chan time.Time, margin time.Duration) bool {
	var out chan<- *message.Message // nil until a handler is free
	handlers := sub.handlers
	for {
		select {
		case handlers <- struct{}{}:
			handlers, out = nil, sub.output
			sub.track(d) // counted in flight from now; the handler may read handedAt
		case out <- d.msg:
			m.handOuts.add(time.Now(), m.halfLock)
			go d.watch()
			return true
		case now := <-renew:
			sub.renewHeld(m, now, held, batch)
			if out == nil && d.status.Load() != 0 {
				return false // given back (renewHeld): no handler freed up for it
			}
			if d.expired(now, margin) {
				if out != nil {
					<-sub.handlers
				}
				d.finish(kgo.AckRelease, LockExpired)
				return false
			}
		case <-sub.stop.Done():
			if out != nil {
				<-sub.handlers
			}
			return false
		}
	}
}

// await waits until every delivery of the batch is answered, renewing the
// acquisition locks of those that take long. On stop it waits up to
// DrainTimeout more, then releases the rest.
func (sub *Subscription) await(m *member, batch []*Delivery, renew <-chan time.Time) {
	for i := 0; i < len(batch); {
		select {
		case <-batch[i].done:
			i++
		case now := <-renew:
			sub.renewHeld(m, now, batch[i:])
			if early := sub.takeEarly(m, batch[i:], renew); len(early) > 0 {
				batch = append(slices.Clone(batch[i:]), early...)
				i = 0
			}
		case <-sub.stop.Done():
			sub.drain(m, batch[i:], renew)
			return
		}
	}
}

func (sub *Subscription) drain(m *member, batch []*Delivery, renew <-chan time.Time) {
	timer := time.NewTimer(sub.cfg.DrainTimeout)
	defer timer.Stop()
	for i := 0; i < len(batch); {
		select {
		case <-batch[i].done:
			i++
			continue
		case now := <-renew:
			sub.renewHeld(m, now, batch[i:])
			continue
		case <-timer.C:
		}
		for _, rest := range batch[i:] {
			rest.finish(kgo.AckRelease, ReleasedAtClose)
		}
		return
	}
}

// renewHeld decides about the locks of the member's unanswered
// deliveries in batches, given in hand-out order, and of the records kgo
// buffered for its next poll (see member.buffer), which come after them
// (planLocks): it renews the locks of those a handler holds or is about
// to take, and gives back those that waited half their lock with no
// handler about to take them.
func (sub *Subscription) renewHeld(m *member, now time.Time, batches ...[]*Delivery) {
	buffered := m.bufferedNow()
	n := len(buffered)
	for _, b := range batches {
		n += len(b)
	}
	ds := make([]*Delivery, 0, n)
	for _, b := range batches {
		ds = append(ds, b...)
	}
	ds = append(ds, buffered...)
	ds = slices.DeleteFunc(ds, func(d *Delivery) bool { return d.status.Load() != 0 })
	if len(ds) == 0 {
		return
	}
	views := make([]lockView, len(ds))
	due := false
	for i, d := range ds {
		views[i] = d.lockView()
		due = due || (!views[i].renewAt.IsZero() && !now.Before(views[i].renewAt))
	}
	if !due {
		return
	}
	fromBuffer := len(ds) - len(buffered)
	for i, a := range planLocks(now, views, m.handOuts.since(now, m.halfLock), sub.cfg.MaxDeliveries) {
		switch a {
		case lockRenew:
			sub.renew(ds[i], now)
		case lockGiveBack:
			sub.giveBack(m, ds[i], i >= fromBuffer)
		}
	}
}

// lockView returns what planLocks reads of d.
func (d *Delivery) lockView() lockView {
	v := lockView{handedOut: !d.handedAt.IsZero(), deliveryCount: d.rec.DeliveryCount()}
	if d.lockSpan > 0 {
		v.renewAt = d.renewAt
	}
	return v
}

// renewCheck is how often a member looks for acquisition locks to renew.
const renewCheck = 100 * time.Millisecond

// renew extends d's acquisition lock (KIP-1222): d is unanswered half-way
// through its lock, and a handler holds it (a long handler, or an
// unresolved Completion, keeps its record instead of seeing it delivered
// to another member) or is about to (planLocks).
func (sub *Subscription) renew(d *Delivery, now time.Time) {
	d.rec.Ack(kgo.AckRenew)
	d.renewAt = now.Add(d.lockSpan / 2)
	d.m.renewals.wait(d.rec.Partition, renewal{d: d, until: now.Add(d.lockSpan).UnixNano()})
	sub.acked.Store(true) // flushed within AckFlushInterval
	sub.stats.update(d.ctr, func(c *Counters) { c.LockRenewals++ })
}

// giveBack releases d, which waited half its lock for a handler, to the
// group: another consumer can take it at once. A record still in kgo's
// buffer (buffered) was not counted received yet, and its poll must skip
// it.
func (sub *Subscription) giveBack(m *member, d *Delivery, buffered bool) {
	if buffered {
		sub.received(d)
		m.markEarly(d)
	}
	d.finish(kgo.AckRelease, GivenBack)
}

// markEarly notes that d's record was answered before a poll returned it
// from kgo's buffer: that poll skips it (take).
func (m *member) markEarly(d *Delivery) {
	if m.early == nil {
		m.early = make(map[*kgo.Record]struct{})
	}
	m.early[d.rec] = struct{}{}
}

// awaitHandler waits, before the member polls, until mayPoll allows it,
// deciding meanwhile about the records kgo buffered (renewHeld). It
// reports false when the subscription stopped first.
func (sub *Subscription) awaitHandler(m *member, renew <-chan time.Time) bool {
	for !mayPoll(time.Now(), cap(sub.handlers)-len(sub.handlers), time.Unix(0, sub.lastFreed.Load()), m.halfLock) {
		select {
		case now := <-renew:
			sub.renewHeld(m, now)
		case <-sub.stop.Done():
			return false
		}
	}
	return true
}

// releaseRecords releases records taken but never made deliveries.
func (sub *Subscription) releaseRecords(recs []*kgo.Record) {
	for _, r := range recs {
		r.Ack(kgo.AckRelease)
		sub.stats.count(r.Topic, r.Partition, func(c *Counters) { c.Received++; c.Released++ })
	}
}

// buffer notes a record kgo just buffered, and when, so that the member
// renews its acquisition lock while it waits and hands it out as a
// handler frees up (takeEarly). Records wait there when a fetch was sent
// after the member's poll had taken its records: kgo
// (MaxConcurrentFetches(0)) allows a fetch while a poll is active, and
// reads that a moment after the poll took the buffered records, so the
// next fetch can go out as the poll returns. Its records would otherwise
// wait for the member's next poll, which comes once its handlers answered
// the poll's messages: longer than a lock when they run long.
//
// It runs on kgo's fetch path, so it only notes: the record's delivery is
// made when the member needs it (bufferedRecord.delivery).
func (m *member) buffer(r *kgo.Record) {
	now := time.Now()
	m.bufferedMu.Lock()
	m.buffered = append(m.buffered, bufferedRecord{rec: r, at: now})
	m.bufferedMu.Unlock()
}

// bufferedRecord is a record kgo buffered for the member's next poll, when
// it did, and its delivery once made.
type bufferedRecord struct {
	rec *kgo.Record
	at  time.Time
	d   *Delivery
}

// delivery returns b's delivery, made now if need be from a fetch sent at
// fetched.
func (b *bufferedRecord) delivery(m *member, fetched time.Time) *Delivery {
	if b.d == nil {
		b.d = m.sub.newDelivery(m, b.rec, fetched, b.at)
	}
	return b.d
}

// takeBuffered returns the deliveries of the records kgo buffered, in
// order, made from fetches sent at fetched where not made yet.
func (m *member) takeBuffered(fetched time.Time) []*Delivery {
	m.bufferedMu.Lock()
	bs := m.buffered
	m.buffered = nil
	m.bufferedMu.Unlock()
	return m.deliveries(bs, fetched)
}

// bufferedNow returns the deliveries of the records waiting in kgo's
// buffer for the member's next poll, made now where need be.
func (m *member) bufferedNow() []*Delivery {
	m.bufferedMu.Lock()
	defer m.bufferedMu.Unlock()
	if len(m.buffered) == 0 {
		return nil
	}
	return m.deliveries(m.buffered, m.lastFetchSent(time.Now()))
}

// deliveries returns the deliveries of bs, made from fetches sent at
// fetched where not made yet (and kept in bs).
func (m *member) deliveries(bs []bufferedRecord, fetched time.Time) []*Delivery {
	ds := make([]*Delivery, len(bs))
	for i := range bs {
		ds[i] = bs[i].delivery(m, fetched)
	}
	return ds
}

// lastFetchSent returns when the fetches answered since the member's last
// poll were sent, at the earliest (or, without any, or): a record kgo
// buffers came with one of them.
func (m *member) lastFetchSent(or time.Time) time.Time {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	return m.earliestAnswered(or)
}

// earliestAnswered is lastFetchSent under sentMu.
func (m *member) earliestAnswered(or time.Time) time.Time {
	var from int64
	for _, sent := range m.answered {
		if from == 0 || sent < from {
			from = sent
		}
	}
	if from == 0 {
		return or
	}
	return time.Unix(0, from)
}

// fetchInFlight reports whether the member has a share fetch sent and not
// answered.
func (m *member) fetchInFlight() bool {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	return len(m.sent) > 0
}

// fetchedFrom returns when the fetches that brought the records of the
// poll that just returned were sent, at the earliest: the records were
// acquired after that. Each broker's last fetch answered since the last
// poll returned counts (an earlier one came back empty, or its records
// were taken by that poll); without any, the poll's start. The records'
// deliveries are made as kgo buffers them (member.buffer); this serves
// any it did not tell of.
func (m *member) fetchedFrom(pollStart time.Time) time.Time {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	from := m.earliestAnswered(pollStart)
	clear(m.answered)
	return from
}
