package frontier

import (
	"errors"
	"fmt"
)

var (
	// ErrRevoked is returned by a Tracker whose assignment was revoked.
	ErrRevoked = errors.New("frontier: assignment revoked")
	// ErrCapacity is returned by Offer when the batch would take the
	// retained entries over the Tracker's capacity. The Tracker is unchanged.
	ErrCapacity = errors.New("frontier: capacity exceeded")
	// ErrInvalidOffer is returned by Offer for a batch that breaks its
	// contract (empty, negative, unordered, overlapping, or a bad next).
	// The Tracker is unchanged.
	ErrInvalidOffer = errors.New("frontier: invalid offer")
)

// doneBit marks a completed entry in entry.offset. Offsets are non-negative,
// so the sign bit is free; packing it keeps an entry at 16 bytes.
const doneBit = -1 << 63

// entry is one delivered record: its offset (with doneBit when completed) and
// the position a consumer resumes from once it and all before it are done.
type entry struct {
	offset int64
	resume int64
}

// Ticket identifies one delivered record of one Tracker. It is a small value
// meant to travel with the record to whoever processes it. The zero Ticket
// belongs to no Tracker and is never accepted.
type Ticket struct {
	tracker *Tracker
	seq     uint64
	offset  int64
}

// Offset returns the Kafka offset of the ticket's record.
func (tk Ticket) Offset() int64 { return tk.offset }

// Valid reports whether the ticket was issued by a Tracker (the zero Ticket
// was not). It says nothing about whether the ticket is still live.
func (tk Ticket) Valid() bool { return tk.tracker != nil }

// Tracker is the completed-prefix bookkeeping of one partition assignment.
// See the package documentation for its concurrency contract.
type Tracker struct {
	// ring holds the retained entries; entry with sequence number s lives at
	// ring[s&mask]. Its length is a power of two, grown on demand up to the
	// first power of two >= capacity.
	ring []entry
	mask uint64
	head uint64 // sequence number of the oldest retained entry
	tail uint64 // sequence number the next offered entry gets

	capacity  int
	start     int64
	safe      int64 // resume position of the completed prefix
	delivered int64 // next of the last offered batch: the next offer starts at or after it
	done      int   // completed entries still retained (blocked behind the head)
	runs      int   // maximal runs of completed entries retained: the ranges of AppendCompleted
	doneEnd   int64 // resume position of the last completed entry retained, while runs > 0
	revoked   bool

	offered   uint64 // records ever offered
	completed uint64 // records ever completed
}

// New returns a Tracker for an assignment that starts consuming at offset
// start and retains at most capacity entries.
func New(start int64, capacity int) (*Tracker, error) {
	if start < 0 {
		return nil, fmt.Errorf("frontier: start offset %d is negative", start)
	}
	if capacity <= 0 {
		return nil, fmt.Errorf("frontier: capacity %d must be positive", capacity)
	}
	return &Tracker{capacity: capacity, start: start, safe: start, delivered: start}, nil
}

// Offer registers one batch of delivered records, in delivery order, and
// returns one Ticket per record. next is the position after the batch (the
// offset a consumer would fetch next). Register the whole batch before any
// of it is dispatched, so that no completion can race past an unregistered
// record.
//
// Offer validates everything before changing anything: offsets must be
// non-empty, non-negative, strictly increasing, start at or after the
// position already delivered, and next must exceed the last offset
// (ErrInvalidOffer). A batch that does not fit in the remaining capacity
// fails with ErrCapacity. On error the Tracker is unchanged.
func (t *Tracker) Offer(offsets []int64, next int64) ([]Ticket, error) {
	if err := t.checkOffer(offsets, next); err != nil {
		return nil, err
	}
	tickets := make([]Ticket, len(offsets))
	for i, off := range offsets {
		resume := next
		if i+1 < len(offsets) {
			resume = offsets[i+1]
		}
		tickets[i] = t.push(off, resume)
	}
	t.delivered = next
	return tickets, nil
}

// OfferOne registers a batch of a single record at offset with resume
// position next. It is the allocation-free form of Offer(offsets[:1], next)
// for consumers that see records one at a time.
func (t *Tracker) OfferOne(offset, next int64) (Ticket, error) {
	if t.revoked {
		return Ticket{}, ErrRevoked
	}
	if offset < t.delivered || next <= offset {
		return Ticket{}, t.checkOffer([]int64{offset}, next)
	}
	if int(t.tail-t.head) >= t.capacity {
		return Ticket{}, ErrCapacity
	}
	tk := t.push(offset, next)
	t.delivered = next
	return tk, nil
}

func (t *Tracker) checkOffer(offsets []int64, next int64) error {
	if t.revoked {
		return ErrRevoked
	}
	if len(offsets) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalidOffer)
	}
	if offsets[0] < 0 {
		return fmt.Errorf("%w: offset %d is negative", ErrInvalidOffer, offsets[0])
	}
	if offsets[0] < t.delivered {
		return fmt.Errorf("%w: offset %d is below the delivered position %d", ErrInvalidOffer, offsets[0], t.delivered)
	}
	for i := 1; i < len(offsets); i++ {
		if offsets[i] <= offsets[i-1] {
			return fmt.Errorf("%w: offsets not strictly increasing at index %d (%d after %d)", ErrInvalidOffer, i, offsets[i], offsets[i-1])
		}
	}
	if last := offsets[len(offsets)-1]; next <= last {
		return fmt.Errorf("%w: next position %d does not follow the last offset %d", ErrInvalidOffer, next, last)
	}
	if len(offsets) > t.capacity-int(t.tail-t.head) {
		return fmt.Errorf("%w: batch of %d with %d of %d retained", ErrCapacity, len(offsets), t.tail-t.head, t.capacity)
	}
	return nil
}

func (t *Tracker) push(offset, resume int64) Ticket {
	if t.tail-t.head == uint64(len(t.ring)) {
		t.grow()
	}
	seq := t.tail
	t.ring[seq&t.mask] = entry{offset: offset, resume: resume}
	t.tail++
	t.offered++
	return Ticket{tracker: t, seq: seq, offset: offset}
}

// grow doubles the ring (at least 16 entries) keeping sequence positions.
func (t *Tracker) grow() {
	n := max(16, 2*len(t.ring))
	ring := make([]entry, n)
	mask := uint64(n - 1)
	for s := t.head; s != t.tail; s++ {
		ring[s&mask] = t.ring[s&t.mask]
	}
	t.ring, t.mask = ring, mask
}

// Complete marks the ticket's record as completed and reports whether it
// did. It returns true only for the first completion of a live ticket issued
// by this Tracker; a duplicate, a ticket of another Tracker, the zero Ticket
// and any ticket after Revoke return false and change nothing.
func (t *Tracker) Complete(tk Ticket) bool {
	if tk.tracker != t || t.revoked || tk.seq < t.head || tk.seq >= t.tail {
		return false
	}
	e := &t.ring[tk.seq&t.mask]
	if e.offset < 0 {
		return false
	}
	e.offset |= doneBit
	t.completed++
	if tk.seq != t.head {
		t.done++
		// A new run, unless it joins the run before it (the head is never
		// complete, so the entry before is retained) or after it, or both.
		t.runs++
		if t.ring[(tk.seq-1)&t.mask].offset < 0 {
			t.runs--
		}
		if tk.seq+1 != t.tail && t.ring[(tk.seq+1)&t.mask].offset < 0 {
			t.runs--
		}
		t.doneEnd = max(t.doneEnd, e.resume)
		return true
	}
	// The head completed: advance over it and every completed entry behind it.
	t.safe = e.resume
	t.head++
	if t.head != t.tail && t.ring[t.head&t.mask].offset < 0 {
		t.runs-- // the run behind the head joins the prefix
	}
	for t.head != t.tail {
		e = &t.ring[t.head&t.mask]
		if e.offset >= 0 {
			break
		}
		t.safe = e.resume
		t.head++
		t.done--
	}
	return true
}

// SafeOffset returns the position from which a consumer may resume without
// losing an unfinished record: the resume position of the last entry of the
// contiguous completed prefix, or the start offset while nothing is complete.
// After Revoke it returns ErrRevoked.
func (t *Tracker) SafeOffset() (int64, error) {
	if t.revoked {
		return 0, ErrRevoked
	}
	return t.safe, nil
}

// Revoke ends the assignment: every outstanding ticket becomes dead, further
// offers fail with ErrRevoked and SafeOffset reports ErrRevoked. Revoking
// twice is harmless. The retained entries are released.
func (t *Tracker) Revoke() {
	t.revoked = true
	t.ring = nil
	t.head, t.tail = 0, 0
	t.done, t.runs = 0, 0
}

// Stats is a snapshot of a Tracker's bookkeeping.
type Stats struct {
	// Start is the offset the assignment started at.
	Start int64
	// SafeOffset is the resume position of the completed prefix.
	SafeOffset int64
	// Delivered is the position after the last offered batch.
	Delivered int64
	// Retained counts entries held: unfinished ones plus completed ones
	// blocked behind the oldest unfinished entry.
	Retained int
	// Blocked counts completed entries held behind an unfinished one.
	Blocked int
	// Capacity is the bound on Retained.
	Capacity int
	// OldestUnfinished is the offset of the oldest unfinished record; it is
	// meaningful only when HasUnfinished is true.
	OldestUnfinished int64
	// HasUnfinished reports whether any offered record is unfinished.
	HasUnfinished bool
	// Offered and Completed count records over the Tracker's life.
	Offered, Completed uint64
	// Revoked reports whether the assignment was revoked.
	Revoked bool
}

// Stats returns a snapshot of the Tracker in O(1).
func (t *Tracker) Stats() Stats {
	s := Stats{
		Start:      t.start,
		SafeOffset: t.safe,
		Delivered:  t.delivered,
		Retained:   int(t.tail - t.head),
		Blocked:    t.done,
		Capacity:   t.capacity,
		Offered:    t.offered,
		Completed:  t.completed,
		Revoked:    t.revoked,
	}
	if t.head != t.tail {
		s.OldestUnfinished = t.ring[t.head&t.mask].offset
		s.HasUnfinished = true
	}
	return s
}

// Retained returns the number of retained entries (unfinished plus
// completed-but-blocked) in O(1).
func (t *Tracker) Retained() int { return int(t.tail - t.head) }

// Blocked returns the number of completed entries retained behind an
// unfinished one (the completed tail) in O(1).
func (t *Tracker) Blocked() int { return t.done }

// Capacity returns the bound on retained entries.
func (t *Tracker) Capacity() int { return t.capacity }

// TailLenBound returns, in O(1), an upper bound on the length of the
// metadata that EncodeTail writes, whatever its budget, for the tail
// AppendCompleted returns, relative to SafeOffset: 0 when that tail is
// empty. It lets a caller that commits the tail tell cheaply, between
// encodings, whether the tail may have grown near its budget. It grows with
// the number of completed ranges and the offsets they span (at most a few
// bytes per range, or one bit per offset), so it is close to the encoded
// size of an incompressible tail and far above that of a regular one.
func (t *Tracker) TailLenBound() int {
	if t.runs == 0 || t.revoked {
		return 0
	}
	return tailLenBound(t.safe, t.doneEnd, t.runs)
}

// AppendCompleted appends to dst the completed records retained behind the
// oldest unfinished one, as half-open ranges [From, To) in ascending order.
// A range spans from a completed record's offset to the resume position of
// the last completed record of its run, so holes between them are covered.
// This is the tail a commit's metadata can carry so that a later owner of
// the partition skips records already done. It costs O(retained).
func (t *Tracker) AppendCompleted(dst []Range) []Range {
	open := false
	var cur Range
	for s := t.head; s != t.tail; s++ {
		e := t.ring[s&t.mask]
		if e.offset >= 0 {
			if open {
				dst = append(dst, cur)
				open = false
			}
			continue
		}
		if !open {
			cur = Range{From: e.offset &^ doneBit}
			open = true
		}
		cur.To = e.resume
	}
	if open {
		dst = append(dst, cur)
	}
	return dst
}
