package consume

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/sentinel"
)

// commitReports tells the host of a subscription's commits. It remembers,
// per partition, the last position the coordinator confirmed, so that a
// commit that sends nothing new (Sarama then sends no request) is not
// reported.
type commitReports struct {
	host         Host
	topic, group string

	mu        sync.Mutex
	confirmed map[int32]kclient.CommittedOffset
}

// commitObservation is one commit of the commit loop, observed: nil
// without an Observer (its methods then do nothing).
type commitObservation struct {
	a       *commitReports
	topic   string
	start   time.Time
	took    time.Duration
	workers []*partition.Worker
	sent    []kclient.CommittedOffset
}

// observeCommit starts observing a commit of the session's marks: call it
// just before sess.Commit, then sent after it and confirmed after the
// positions were read back.
func (h *member) observeCommit() *commitObservation {
	a := h.sub.commits
	if a == nil {
		return nil
	}
	workers := h.workers.list()
	c := &commitObservation{a: a, topic: h.sub.topic}
	a.mu.Lock()
	for _, w := range workers {
		off, meta := w.MarkedPosition()
		if prev, ok := a.confirmed[w.Partition()]; off < 0 || ok && prev.Offset == off && prev.Metadata == meta {
			continue
		}
		c.workers = append(c.workers, w)
		c.sent = append(c.sent, kclient.CommittedOffset{Offset: off, Metadata: meta})
	}
	a.mu.Unlock()
	c.start = time.Now()
	return c
}

func (c *commitObservation) sentNow() {
	if c != nil {
		c.took = time.Since(c.start)
	}
}

// confirmed reports the commit, with the positions read back since.
func (c *commitObservation) confirmed() {
	if c == nil || len(c.workers) == 0 {
		return
	}
	ev := CommitReport{Topic: c.topic, Group: c.a.group, Start: c.start, Duration: c.took,
		Partitions: make([]CommittedPartition, len(c.workers))}
	behind := 0
	c.a.mu.Lock()
	if c.a.confirmed == nil {
		c.a.confirmed = make(map[int32]kclient.CommittedOffset)
	}
	for i, w := range c.workers {
		p, sent := w.Partition(), c.sent[i]
		ev.Partitions[i] = committedPartition(p, sent.Offset, sent.Metadata)
		if w.Stats().ConfirmedOffset < sent.Offset {
			behind++
			continue
		}
		c.a.confirmed[p] = sent
	}
	c.a.mu.Unlock()
	if behind > 0 {
		ev.Err = &commitBehindError{partitions: behind}
	}
	c.a.host.Committed(ev)
}

// final reports the final commit of assignments that ended, with
// the last position each one tried: one CommitEvent with Final set for
// the positions the group holds (held), and one whose Err wraps
// sentinel.ErrCommitNotConfirmed (and cause, when not nil) for those it does not
// (notHeld). An Observer's spans of acked deliveries that neither covers
// end with it: those records are the next owner's to hand out again.
// Nil reports nothing.
func (a *commitReports) final(start time.Time, took time.Duration, transactional bool,
	held, notHeld map[int32]kclient.CommittedOffset, cause error) {
	if a == nil {
		return
	}
	event := func(positions map[int32]kclient.CommittedOffset, err error) {
		if len(positions) == 0 {
			return
		}
		ev := CommitReport{Topic: a.topic, Group: a.group, Transactional: transactional, Final: true,
			Start: start, Duration: took, Err: err, Partitions: make([]CommittedPartition, 0, len(positions))}
		for p, c := range positions {
			ev.Partitions = append(ev.Partitions, committedPartition(p, c.Offset, c.Metadata))
		}
		slices.SortFunc(ev.Partitions, func(x, y CommittedPartition) int { return cmp.Compare(x.Partition, y.Partition) })
		a.host.Committed(ev)
	}
	if !transactional && len(held) > 0 {
		a.mu.Lock()
		if a.confirmed == nil {
			a.confirmed = make(map[int32]kclient.CommittedOffset)
		}
		for p, c := range held {
			a.confirmed[p] = c
		}
		a.mu.Unlock()
	}
	event(held, nil)
	event(notHeld, &finalNotCommittedError{partitions: len(notHeld), cause: cause})
}

// finalNotCommittedError is CommitEvent.Err of a final commit the group
// does not hold.
type finalNotCommittedError struct {
	partitions int
	cause      error // why, when known (nil: the read-back found an earlier position)
}

func (e *finalNotCommittedError) Error() string {
	msg := sentinel.ErrCommitNotConfirmed.Error() + ": the final position of " + strconv.Itoa(e.partitions) + " partition(s) is not held"
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *finalNotCommittedError) Unwrap() []error {
	if e.cause == nil {
		return []error{sentinel.ErrCommitNotConfirmed}
	}
	return []error{sentinel.ErrCommitNotConfirmed, e.cause}
}

func committedPartition(partition int32, offset int64, metadata string) CommittedPartition {
	return CommittedPartition{Partition: partition, Offset: offset, Metadata: metadata}
}

// commitBehindError is CommitEvent.Err for a commit the read-back did not
// find.
type commitBehindError struct{ partitions int }

func (e *commitBehindError) Error() string {
	return sentinel.ErrCommitNotConfirmed.Error() + ": " + strconv.Itoa(e.partitions) + " partition(s) held below the position sent"
}

func (e *commitBehindError) Unwrap() error { return sentinel.ErrCommitNotConfirmed }
