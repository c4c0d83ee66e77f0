package consume

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/sentinel"
)

// sessionOffsets commits positions through a group session's offset
// manager and reads back what the coordinator holds, committing again
// until it holds them: the pinned starts of a session (in either mode:
// a start has no outputs), the divergence point of a truncated log, and
// the offset committer's final positions.
type sessionOffsets struct {
	sub   *subscription
	reads clusterReads
}

// pinStarts commits a start position for the claimed partitions on which
// the group has no commit, before Sarama starts them: Offsets.Initial
// resolved now (starts, listed by Setup). Sarama then fetches from exactly
// there (the claim's InitialOffset is that offset), and the group's
// position is at the broker before any record is handed out, so a member
// that dies or loses the partition before handing a record out does not
// leave the next one to resolve Offsets.Initial afresh (at OffsetNewest,
// skipping what came in between). Partitions whose start cannot be pinned
// here (a cooperative claim added without Setup, a commit out of range, an
// error) start at their first record instead (fixStart).
//
// The marks are made here, so that Sarama's claims fetch from them; the
// commit is sent in the background, beside the claims' first fetches, and
// the returned channel closes once the coordinator holds it (see
// commitPinned). ConsumeClaim hands nothing out before that.
func (s sessionOffsets) pinStarts(sess groupSession, claimed []int32, committed map[int32]kclient.CommittedOffset,
	starts map[int32]int64, startErrs map[int32]error) <-chan struct{} {
	pinned := make(map[int32]int64)
	for _, p := range claimed {
		if c, ok := committed[p]; !ok || c.Offset >= 0 {
			continue
		}
		start, ok := starts[p]
		if !ok {
			fields := watermill.LogFields{"kafka_partition": p}
			if err := startErrs[p]; err != nil {
				fields["err"] = err.Error()
			}
			s.sub.logger.Debug("Cannot resolve the start offset; the partition starts at its first record",
				s.sub.logFields.Add(fields))
			continue
		}
		sess.MarkOffset(s.sub.topic, p, start, "")
		committed[p] = kclient.CommittedOffset{Offset: start}
		pinned[p] = start
		s.sub.logStartWithoutCommit(p, start)
	}
	if len(pinned) == 0 {
		return closedChan
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.commitPinned(sess, pinned)
	}()
	return done
}

// commitPinned commits the pinned starts and reads them back, committing
// again until the coordinator holds them or the session ends (see
// commitUntilHeld): a record handed out while the group has no commit is
// skipped by the next owner at OffsetNewest if this member dies before it
// is committed.
func (s sessionOffsets) commitPinned(sess groupSession, starts map[int32]int64) {
	want := make(map[int32]kclient.CommittedOffset, len(starts))
	for p, start := range starts {
		want[p] = kclient.CommittedOffset{Offset: start}
	}
	missing, _, err := s.commitUntilHeld(sess.Context(), sess, want, func(missing map[int32]int64, err error, retryIn time.Duration) {
		fields := watermill.LogFields{"partitions": len(missing), "retry_in": retryIn.String()}
		if err != nil {
			fields["err"] = err.Error()
		}
		s.sub.logger.Info("The start of partitions without a commit is not committed yet; nothing is handed out until it is",
			s.sub.logFields.Add(fields))
	})
	if len(missing) == 0 && err == nil {
		s.sub.logger.Debug("Committed the start of partitions without a commit",
			s.sub.logFields.Add(watermill.LogFields{"partitions": len(starts)}))
	}
}

// commitUntilHeld commits the session's marks and reads back what the
// coordinator holds for the partitions of want, committing again (paced
// by backoff.Doubling) until it holds each one's position, or a later one
// (see kclient.CommittedOffset.holds), or until ctx ends or the session is fenced.
// Sarama does not report a refused commit (a coordinator loading or moving
// the group refuses it), so only a read-back tells. One read each round,
// given up with ctx: kclient.FetchCommitted's own retries, and a coordinator that
// does not answer, would overrun a caller's bound. waiting, when not nil,
// is told of each round that found positions missing. It returns the
// positions still missing (none when all are held), what the coordinator
// last answered, and the last read's error (sentinel.ErrInstanceFenced when the
// session was fenced: its positions are not this member's to commit any
// more).
func (s sessionOffsets) commitUntilHeld(ctx context.Context, sess groupSession, want map[int32]kclient.CommittedOffset,
	waiting func(missing map[int32]int64, err error, retryIn time.Duration)) (missing map[int32]int64, lastHeld map[int32]kclient.CommittedOffset, err error) {
	parts := make([]int32, 0, len(want))
	for p, w := range want {
		if w.Offset >= 0 {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return nil, nil, nil
	}
	var pace backoff.Doubling
	for !sessionFenced(sess.Context()) {
		callWithin(ctx, sess.Commit)
		var held map[int32]kclient.CommittedOffset
		held, err = fetchCommittedWithin(ctx, s.reads, parts)
		if err == nil {
			lastHeld = held
		}
		missing = make(map[int32]int64)
		for _, p := range parts {
			w := want[p]
			if c, ok := held[p]; err != nil || !ok || !c.Holds(w) {
				missing[p] = w.Offset
			}
		}
		if len(missing) == 0 {
			return nil, lastHeld, nil
		}
		wait := pace.Next()
		if waiting != nil {
			waiting(missing, err, wait)
		}
		if !backoff.Sleep(ctx, wait) {
			return missing, lastHeld, err
		}
	}
	return missing, lastHeld, sentinel.ErrInstanceFenced
}

// confirm commits and reads back until the coordinator holds each
// partition's mark in marks (see commitUntilHeld), until ctx ends. With
// Sarama's auto-commit off, the marks of a partition whose claim ended are
// dropped without being flushed again: the next owner would handle again
// everything acked since the last commit the coordinator took. What the
// coordinator does not hold when ctx ends is logged as an Error, partition
// by partition. The assignments of marks are over: an Observer is told of
// their final positions (see commitReports.final).
func (s sessionOffsets) confirm(ctx context.Context, sess groupSession, marks map[int32]kclient.CommittedOffset) {
	start := time.Now()
	missing, held, err := s.commitUntilHeld(ctx, sess, marks, nil)
	fenced := errors.Is(err, sentinel.ErrInstanceFenced)
	if len(missing) > 0 && !fenced {
		s.logUncommitted(missing, held, err)
	}
	if s.sub.workerCfg.Observer == nil {
		return
	}
	// A partition that never marked (-1: no record fixed its start) had
	// nothing handed out: no final position to report.
	took := time.Since(start)
	finalHeld := make(map[int32]kclient.CommittedOffset, len(marks))
	notHeld := make(map[int32]kclient.CommittedOffset)
	for p, m := range marks {
		switch _, miss := missing[p]; {
		case m.Offset < 0:
		case miss || fenced: // a fenced session's positions are the fencing member's
			notHeld[p] = m
		default:
			finalHeld[p] = m
		}
	}
	s.sub.commits.final(start, took, false, finalHeld, notHeld, err)
}

// logUncommitted reports final positions the group coordinator does not
// hold: partition and offset of each ("uncommitted"), and what the
// coordinator held when last read ("held", when it answered).
func (s sessionOffsets) logUncommitted(missing map[int32]int64, held map[int32]kclient.CommittedOffset, err error) {
	fields := watermill.LogFields{"uncommitted": positions(missing), "partitions": len(missing)}
	if held != nil {
		offs := make(map[int32]int64, len(missing))
		for p := range missing {
			if c, ok := held[p]; ok {
				offs[p] = c.Offset
			}
		}
		fields["held"] = positions(offs)
	}
	if err == nil {
		err = errors.New("the group coordinator holds an earlier position")
	}
	s.sub.logger.Error("Final positions not committed: the next owner handles again the records acked after the position the group holds",
		err, s.sub.logFields.Add(fields))
}
