package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// txnSessionCommitter is the committer of a transactional subscription:
// each session is an epoch of the subscription's txnCommitter, whose
// transactions carry the session's positions with the outputs of the
// records they cover, once per commit interval and at each drain.
type txnSessionCommitter struct {
	h *member
	c *txnCommitter

	// Per session: set by begin, ended by stopLoop.
	stop chan struct{}
	done chan struct{}
}

var _ committer = (*txnSessionCommitter)(nil)

// withoutCommitted ends the session: handling a committed tail's records
// again would write their outputs twice. The next session reads the
// commits again.
func (t *txnSessionCommitter) withoutCommitted(what string, err error) error {
	return fmt.Errorf("safeack: reading %s for a transactional session: %w", what, err)
}

// begin starts the session's epoch (see txnCommitter.beginSession); a
// transaction that fails ends every assignment of the session, whose next
// one fetches from the committed offsets.
func (t *txnSessionCommitter) begin(sess groupSession, committed map[int32]kclient.CommittedOffset) {
	t.c.beginSession(sess, committed, t.h.workers.endAll)
	t.stop, t.done = make(chan struct{}), make(chan struct{})
	go t.commitLoop(t.stop, t.done)
}

func (t *txnSessionCommitter) stopLoop(ctx context.Context) {
	if t.stop == nil {
		return
	}
	close(t.stop)
	waitOr(ctx, t.done)
	t.stop = nil
}

// finish commits what the session's drained partitions completed and ends
// the epoch (see txnCommitter.finishSession).
func (t *txnSessionCommitter) finish(context.Context, groupSession) {
	t.c.finishSession()
}

// claim gives the claim a marker of its own: a new assignment of the
// partition, which owns its positions and outputs until the claim returns.
// Its drain commits the final position in a transaction (Commit).
func (t *txnSessionCommitter) claim(_ groupSession, p int32) claimCommits {
	m := t.c.newMarker(p)
	return claimCommits{
		marker:     m,
		deliveries: m,
		bound: func(w *partition.Worker, commit kclient.CommittedOffset, have bool) {
			m.bind(w)
			if have {
				m.startFrom(commit)
			}
		},
		release: m.release,
	}
}

// commitLoop commits the session's transaction every interval, after
// marking each partition's completed prefix and tail.
func (t *txnSessionCommitter) commitLoop(stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(t.c.interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			t.h.workers.markTails()
			t.c.commit()
			t.h.listHighWaterMarks()
		case <-stop:
			return
		}
	}
}

// errTxnNeedsGroup guards the path without a consumer group, which
// NewTxnSubscriber (and NewTxnPublisher) refuse.
var errTxnNeedsGroup = errors.New("safeack: transactional mode needs a consumer group")

// startTxn gives the subscription its transactional commit path.
func (sub *subscription) startTxn(pub *Txn) error {
	if sub.cfg.ConsumerGroup == "" {
		return errTxnNeedsGroup
	}
	if err := pub.claimTopic(sub.topic); err != nil {
		return err
	}
	c, err := newTxnCommitter(pub, sub)
	if err != nil {
		pub.releaseTopic(sub.topic)
		return err
	}
	sub.txn = c
	return nil
}
