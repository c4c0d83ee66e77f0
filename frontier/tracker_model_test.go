package frontier_test

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/safeack/safeack/frontier"
)

var modelSeed = flag.Uint64("frontier.seed", 0, "seed for TestModel (0: derive one from the clock and log it)")

// ---- the reference ----------------------------------------------------------

// refTracker is a deliberately naive model of the contract, written without
// looking at how Tracker stores anything: it keeps every record its tracker
// was ever offered, in delivery order, with a done flag, and recomputes
// everything by scanning from the first record.
type refTracker struct {
	start, delivered int64
	capacity         int
	recs             []refRecord
	completed        uint64
	revoked          bool
	safeAtRevoke     int64

	scanned  int   // recs[:scanned] are done
	scanSafe int64 // the resume position of recs[scanned-1]
}

type refRecord struct {
	offset, resume int64
	done           bool
}

// prefix returns the safe offset and the index of the first unfinished
// record (len(recs) if there is none): the scan over the completed records
// from the first one. Records never become unfinished again, so the scan
// resumes where it last stopped (which keeps long fuzz inputs linear).
func (r *refTracker) prefix() (safe int64, firstUnfinished int) {
	if r.scanned == 0 {
		r.scanSafe = r.start
	}
	for r.scanned < len(r.recs) && r.recs[r.scanned].done {
		r.scanSafe = r.recs[r.scanned].resume
		r.scanned++
	}
	return r.scanSafe, r.scanned
}

func (r *refTracker) retained() int {
	if r.revoked {
		return 0
	}
	_, u := r.prefix()
	return len(r.recs) - u
}

// check reports which errors an offer may legitimately produce.
func (r *refTracker) check(offsets []int64, next int64) (revoked, invalid, overCapacity bool) {
	if r.revoked {
		return true, false, false
	}
	if len(offsets) == 0 {
		invalid = true
	}
	for i, o := range offsets {
		if o < 0 || o < r.delivered || (i > 0 && o <= offsets[i-1]) {
			invalid = true
		}
	}
	if len(offsets) > 0 && next <= offsets[len(offsets)-1] {
		invalid = true
	}
	overCapacity = r.retained()+len(offsets) > r.capacity
	return false, invalid, overCapacity
}

// offer appends a valid batch and returns the index of its first record.
func (r *refTracker) offer(offsets []int64, next int64) int {
	first := len(r.recs)
	for i, o := range offsets {
		resume := next
		if i < len(offsets)-1 {
			resume = offsets[i+1]
		}
		r.recs = append(r.recs, refRecord{offset: o, resume: resume})
	}
	r.delivered = next
	return first
}

func (r *refTracker) complete(i int) bool {
	if r.revoked || r.recs[i].done {
		return false
	}
	r.recs[i].done = true
	r.completed++
	return true
}

func (r *refTracker) revoke() {
	if !r.revoked {
		r.safeAtRevoke, _ = r.prefix()
	}
	r.revoked = true
}

func (r *refTracker) safe() int64 {
	if r.revoked {
		return r.safeAtRevoke
	}
	s, _ := r.prefix()
	return s
}

func (r *refTracker) stats() frontier.Stats {
	s := frontier.Stats{
		Start:      r.start,
		SafeOffset: r.safe(),
		Delivered:  r.delivered,
		Capacity:   r.capacity,
		Offered:    uint64(len(r.recs)),
		Completed:  r.completed,
		Revoked:    r.revoked,
	}
	if r.revoked {
		return s
	}
	_, u := r.prefix()
	for i := u; i < len(r.recs); i++ {
		s.Retained++
		if r.recs[i].done {
			s.Blocked++
		}
	}
	if u < len(r.recs) {
		s.OldestUnfinished, s.HasUnfinished = r.recs[u].offset, true
	}
	return s
}

func (r *refTracker) ranges() []frontier.Range {
	if r.revoked {
		return nil
	}
	var out []frontier.Range
	_, u := r.prefix()
	inRun := false
	for i := u; i < len(r.recs); i++ {
		if !r.recs[i].done {
			inRun = false
			continue
		}
		if !inRun {
			out = append(out, frontier.Range{From: r.recs[i].offset, To: r.recs[i].resume})
			inRun = true
		} else {
			out[len(out)-1].To = r.recs[i].resume
		}
	}
	return out
}

// ---- the harness --------------------------------------------------------------

// chooser supplies the harness's decisions: from math/rand in TestModel, from
// fuzz bytes in FuzzTracker.
type chooser interface {
	// intn returns a value in [0, n); n >= 1.
	intn(n int) int
	exhausted() bool
}

type randChooser struct{ r *rand.Rand }

func (c randChooser) intn(n int) int  { return c.r.IntN(n) }
func (c randChooser) exhausted() bool { return false }

type byteChooser struct{ b []byte }

func (c *byteChooser) intn(n int) int {
	if n <= 1 {
		return 0
	}
	v := 0
	for span := 1; span < n; span <<= 8 {
		if len(c.b) == 0 {
			break
		}
		v = v<<8 | int(c.b[0])
		c.b = c.b[1:]
	}
	return v % n
}

func (c *byteChooser) exhausted() bool { return len(c.b) == 0 }

// partition is one tracker and its reference; tickets[i] is the ticket of
// the reference's record i.
type partition struct {
	name    string
	tr      *frontier.Tracker
	ref     *refTracker
	tickets []frontier.Ticket
}

// model drives two partitions (so that there is always a live foreign
// tracker) through random operations and compares each with its reference
// after every operation.
type model struct {
	t       testing.TB
	c       chooser
	parts   [2]*partition
	retired []frontier.Ticket // tickets of replaced trackers
	gen     int
	ops     int
	trace   []string
	buf     []frontier.Range
	context string // how to reproduce, printed on failure
}

func newModel(t testing.TB, c chooser, context string) *model {
	m := &model{t: t, c: c, context: context}
	for i := range m.parts {
		m.parts[i] = m.newPartition(int64(c.intn(200)))
	}
	return m
}

func (m *model) newPartition(start int64) *partition {
	m.gen++
	capacity := 1 + m.c.intn(24)
	if m.c.intn(8) == 0 {
		capacity = 1 + m.c.intn(300)
	}
	tr, err := frontier.New(start, capacity)
	if err != nil {
		m.fail("New(%d, %d): %v", start, capacity, err)
	}
	p := &partition{
		name: fmt.Sprintf("gen%d", m.gen),
		tr:   tr,
		ref:  &refTracker{start: start, delivered: start, capacity: capacity},
	}
	m.note("%s = New(%d, %d)", p.name, start, capacity)
	return p
}

func (m *model) note(format string, args ...any) {
	const keep = 40
	if len(m.trace) == keep {
		copy(m.trace, m.trace[1:])
		m.trace = m.trace[:keep-1]
	}
	m.trace = append(m.trace, fmt.Sprintf("op %d: ", m.ops)+fmt.Sprintf(format, args...))
}

func (m *model) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("%s\n%s\nlast operations:\n  %s", m.context, fmt.Sprintf(format, args...), strings.Join(m.trace, "\n  "))
}

// run performs up to maxOps operations (fewer if the chooser runs dry).
func (m *model) run(maxOps int) {
	for m.ops = 0; m.ops < maxOps && !m.c.exhausted(); m.ops++ {
		m.step()
	}
}

func (m *model) step() {
	pi := m.c.intn(2)
	p := m.parts[pi]
	switch k := m.c.intn(32); {
	case k < 8:
		m.offer(p, false)
	case k < 11:
		m.offer(p, true)
	case k < 24:
		m.completeRetained(p)
	case k < 27:
		m.completeAny(p)
	case k < 30:
		m.completeForeign(p, m.parts[1-pi])
	case k < 31:
		if m.c.intn(3) == 0 {
			m.revokeOrReplace(pi)
		} else {
			m.completeRetained(p)
		}
	default:
		m.checkIdle(p)
	}
	for _, p := range m.parts {
		m.compare(p)
	}
}

// batch draws a batch: mostly valid, with random holes before, between and
// after its offsets; sometimes breaking one rule; sometimes big enough to hit
// the capacity.
func (m *model) batch(p *partition, one bool) ([]int64, int64) {
	n := 1
	if !one {
		n = 1 + m.c.intn(6)
		if m.c.intn(6) == 0 {
			n = 1 + m.c.intn(p.ref.capacity+3)
		}
	}
	offs := make([]int64, n)
	o := p.ref.delivered
	if m.c.intn(2) == 0 {
		o += int64(m.c.intn(5)) // hole before the batch
	}
	for i := range offs {
		offs[i] = o
		o++
		if m.c.intn(3) == 0 {
			o += int64(m.c.intn(4)) // hole inside the batch
		}
	}
	next := o
	if m.c.intn(3) == 0 {
		next += int64(m.c.intn(4)) // hole after the batch
	}
	if m.c.intn(8) != 0 {
		return offs, next
	}
	last := len(offs) - 1
	switch m.c.intn(7) {
	case 0: // negative
		offs[m.c.intn(len(offs))] = -1 - int64(m.c.intn(3))
	case 1: // below the delivered position
		offs[0] = p.ref.delivered - 1 - int64(m.c.intn(4))
	case 2: // next not after the last offset
		next = offs[last] - int64(m.c.intn(3))
	case 3: // repeated offset
		if !one {
			offs = append(offs, offs[last])
		}
	case 4: // decreasing
		if !one {
			offs = append(offs, offs[last]-1-int64(m.c.intn(3)))
		}
	case 5: // empty
		if !one {
			offs = offs[:0]
		}
	case 6: // next far away (valid)
		next += int64(m.c.intn(1 << 20))
	}
	return offs, next
}

func (m *model) offer(p *partition, one bool) {
	offs, next := m.batch(p, one)
	revoked, invalid, overCap := p.ref.check(offs, next)
	var tks []frontier.Ticket
	var err error
	if one {
		m.note("%s.OfferOne(%d, %d)", p.name, offs[0], next)
		var tk frontier.Ticket
		tk, err = p.tr.OfferOne(offs[0], next)
		if err == nil {
			tks = []frontier.Ticket{tk}
		} else if tk != (frontier.Ticket{}) {
			m.fail("failed OfferOne returned ticket %+v", tk)
		}
	} else {
		m.note("%s.Offer(%v, %d)", p.name, offs, next)
		tks, err = p.tr.Offer(offs, next)
		if err != nil && tks != nil {
			m.fail("failed Offer returned tickets %v", tks)
		}
	}
	switch {
	case revoked:
		if !errors.Is(err, frontier.ErrRevoked) {
			m.fail("offer to a revoked tracker: %v, want ErrRevoked", err)
		}
	case invalid || overCap:
		ok := (invalid && errors.Is(err, frontier.ErrInvalidOffer)) || (overCap && errors.Is(err, frontier.ErrCapacity))
		if !ok {
			m.fail("offer: %v, want invalid=%v overCapacity=%v", err, invalid, overCap)
		}
	default:
		if err != nil {
			m.fail("valid offer refused: %v (retained %d of %d)", err, p.ref.retained(), p.ref.capacity)
		}
		if len(tks) != len(offs) {
			m.fail("offer returned %d tickets for %d offsets", len(tks), len(offs))
		}
		for i, tk := range tks {
			if !tk.Valid() || tk.Offset() != offs[i] {
				m.fail("ticket %d: valid %v offset %d, want offset %d", i, tk.Valid(), tk.Offset(), offs[i])
			}
		}
		if first := p.ref.offer(offs, next); first != len(p.tickets) {
			m.fail("model bookkeeping out of step")
		}
		p.tickets = append(p.tickets, tks...)
	}
}

func (m *model) completeIndex(p *partition, i int) {
	m.note("%s.Complete(#%d offset %d)", p.name, i, p.ref.recs[i].offset)
	want := p.ref.complete(i)
	if got := p.tr.Complete(p.tickets[i]); got != want {
		m.fail("%s.Complete(#%d offset %d) = %v, want %v", p.name, i, p.ref.recs[i].offset, got, want)
	}
}

// completeRetained completes one of the records the tracker should still
// hold (unfinished, or done and blocked: a duplicate).
func (m *model) completeRetained(p *partition) {
	_, u := p.ref.prefix()
	if u == len(p.ref.recs) {
		m.completeAny(p)
		return
	}
	// Favour the head now and then so the prefix moves.
	i := u
	if m.c.intn(3) != 0 {
		i = u + m.c.intn(len(p.ref.recs)-u)
	}
	m.completeIndex(p, i)
}

// completeAny completes any ticket this tracker ever issued, usually a
// duplicate of one already released.
func (m *model) completeAny(p *partition) {
	if len(p.tickets) == 0 {
		m.completeForeign(p, nil)
		return
	}
	m.completeIndex(p, m.c.intn(len(p.tickets)))
}

// completeForeign offers p a ticket it did not issue: the zero Ticket, one of
// the other live tracker, or one of a replaced tracker.
func (m *model) completeForeign(p, other *partition) {
	var tk frontier.Ticket
	what := "zero ticket"
	switch m.c.intn(3) {
	case 0:
		if other != nil && len(other.tickets) > 0 {
			tk = other.tickets[m.c.intn(len(other.tickets))]
			what = "ticket of " + other.name
		}
	case 1:
		if len(m.retired) > 0 {
			tk = m.retired[m.c.intn(len(m.retired))]
			what = "ticket of a replaced tracker"
		}
	}
	m.note("%s.Complete(%s, offset %d)", p.name, what, tk.Offset())
	if p.tr.Complete(tk) {
		m.fail("%s accepted a %s (offset %d)", p.name, what, tk.Offset())
	}
}

// revokeOrReplace revokes a live tracker; a revoked one is replaced by a new
// tracker for the same partition starting at its last safe offset (or
// elsewhere), whose tickets may coincide in offset and position with the old.
func (m *model) revokeOrReplace(pi int) {
	p := m.parts[pi]
	if !p.ref.revoked {
		m.note("%s.Revoke()", p.name)
		p.tr.Revoke()
		p.ref.revoke()
		if m.c.intn(4) == 0 {
			m.note("%s.Revoke() again", p.name)
			p.tr.Revoke()
		}
		return
	}
	start := p.ref.safeAtRevoke
	if m.c.intn(2) == 0 {
		start = p.ref.start // the same offsets again
	}
	m.retired = append(m.retired, p.tickets...)
	if len(m.retired) > 4096 {
		m.retired = m.retired[len(m.retired)-4096:]
	}
	m.parts[pi] = m.newPartition(start)
}

// checkIdle checks read-only calls in isolation.
func (m *model) checkIdle(p *partition) {
	m.note("%s read-only", p.name)
	if p.tr.Retained() != p.ref.retained() || p.tr.Capacity() != p.ref.capacity ||
		p.tr.Delivered() != p.ref.delivered || p.tr.Revoked() != p.ref.revoked {
		m.fail("%s accessors: retained %d capacity %d delivered %d revoked %v; want %d %d %d %v",
			p.name, p.tr.Retained(), p.tr.Capacity(), p.tr.Delivered(), p.tr.Revoked(),
			p.ref.retained(), p.ref.capacity, p.ref.delivered, p.ref.revoked)
	}
}

func (m *model) compare(p *partition) {
	safe, err := p.tr.SafeOffset()
	if p.ref.revoked {
		if !errors.Is(err, frontier.ErrRevoked) {
			m.fail("%s.SafeOffset after Revoke = %d, %v; want ErrRevoked", p.name, safe, err)
		}
	} else if err != nil || safe != p.ref.safe() {
		m.fail("%s.SafeOffset = %d, %v; want %d", p.name, safe, err, p.ref.safe())
	}
	if got, want := p.tr.Stats(), p.ref.stats(); got != want {
		m.fail("%s.Stats:\n got  %+v\n want %+v", p.name, got, want)
	}
	m.buf = p.tr.AppendCompleted(m.buf[:0])
	want := p.ref.ranges()
	if len(m.buf) != len(want) {
		m.fail("%s.AppendCompleted = %v, want %v", p.name, m.buf, want)
	}
	for i := range want {
		if m.buf[i] != want[i] {
			m.fail("%s.AppendCompleted = %v, want %v", p.name, m.buf, want)
		}
	}
	if got := frontier.CompletedRuns(p.tr); !p.ref.revoked && got != len(want) {
		m.fail("%s keeps %d completed runs, AppendCompleted has %d ranges", p.name, got, len(want))
	}
	// TailLenBound bounds the encoded tail, whatever the budget.
	if !p.ref.revoked && len(m.buf) > 0 {
		bound := p.tr.TailLenBound()
		for _, budget := range []int{24, frontier.DefaultMetadataBudget, 1 << 20} {
			if meta, _, err := frontier.EncodeTail(safe, m.buf, budget); err != nil || len(meta) > bound {
				m.fail("%s: EncodeTail(%d, %v, %d) = %d bytes, %v; TailLenBound %d", p.name, safe, m.buf, budget, len(meta), err, bound)
			}
		}
	} else if bound := p.tr.TailLenBound(); bound != 0 {
		m.fail("%s.TailLenBound = %d with no tail", p.name, bound)
	}
	// Whatever the reference says, the tail must be what the codec accepts:
	// non-empty, ascending, maximal (never adjacent) ranges after the oldest
	// unfinished record.
	st := p.tr.Stats()
	for i, r := range m.buf {
		if r.From >= r.To || (i > 0 && m.buf[i-1].To >= r.From) || !st.HasUnfinished || r.From <= st.OldestUnfinished {
			m.fail("%s.AppendCompleted = %v is not a tail behind %d", p.name, m.buf, st.OldestUnfinished)
		}
	}
}

// ---- the randomized test -------------------------------------------------------

func TestModel(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -frontier.seed=%d)", seed, seed)
	runs, ops := 24, 2500
	if testing.Short() {
		runs = 8
	}
	for run := range runs {
		r := rand.New(rand.NewPCG(seed, uint64(run)))
		m := newModel(t, randChooser{r}, fmt.Sprintf("TestModel seed %d run %d (rerun with -frontier.seed=%d)", seed, run, seed))
		m.run(ops)
	}
}

// TestModelFixedSeeds always covers the same ground, whatever the clock says.
func TestModelFixedSeeds(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		r := rand.New(rand.NewPCG(seed, seed))
		newModel(t, randChooser{r}, fmt.Sprintf("fixed seed %d", seed)).run(3000)
	}
}
