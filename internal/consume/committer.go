package consume

import (
	"context"

	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// committer is where a group session's completed positions go: the
// session's offset manager (offsetCommitter: a commit loop, and final
// commits read back until the coordinator holds them) or Kafka
// transactions (txnSessionCommitter: the positions with the outputs of the
// records they cover). The group handler picks one when the subscription
// starts (newCommitter) and drives it through each session's lifecycle:
// begin in Setup, claim in each ConsumeClaim, stopLoop then finish in
// Cleanup. Nothing else in the group handler depends on the mode.
type committer interface {
	// withoutCommitted is asked when the group's committed offsets (what,
	// for the log) could not be read, with the read's error. It returns
	// nil when the session goes on without them (records after the commit
	// are handled again: more repeats, nothing lost), or the error that
	// ends the session (Sarama runs Cleanup, and the next session reads
	// them again).
	withoutCommitted(what string, err error) error
	// begin starts committing for a session whose claims start from
	// committed (what Setup read; nil when it could not): its commit loop
	// runs until stopLoop.
	begin(sess groupSession, committed map[int32]kclient.CommittedOffset)
	// claim returns where the completed positions of a claim of partition
	// go, for the claim's worker.
	claim(sess groupSession, partition int32) claimCommits
	// stopLoop stops the session's commit loop and waits, until ctx ends,
	// for its commit in flight. It may be called without begin (a Setup
	// that failed).
	stopLoop(ctx context.Context)
	// finish commits what the session's claims ended with, within ctx.
	finish(ctx context.Context, sess groupSession)
}

// newCommitter returns the committer of h's subscription: transactional
// when it has a transactional producer.
func newCommitter(h *member) committer {
	if h.sub.txn != nil {
		return &txnSessionCommitter{h: h, c: h.sub.txn}
	}
	return &offsetCommitter{h: h}
}

// claimCommits is where one claim's completed positions go.
type claimCommits struct {
	// marker takes the worker's marks and commits (partition.Assignment's
	// Marker); deliveries, when not nil, its delivery hooks.
	marker     partition.Marker
	deliveries partition.DeliveryHooks
	// requestCommit asks for a commit now (nil: none is taken early).
	requestCommit func()
	// startCommitted reads back whether the group holds a start the
	// worker committed (nil: the marker's Commit confirms it).
	startCommitted func(offset int64) bool
	// bound is told of the claim's worker before it runs, with the
	// group's commit it starts from (have false: none).
	bound func(w *partition.Worker, commit kclient.CommittedOffset, have bool)
	// ended runs once the worker returned: the claim's assignment is over,
	// with the last position its marks reached.
	ended func(offset int64, metadata string)
	// release runs as the claim returns, after ended.
	release func()
}

func (c claimCommits) bind(w *partition.Worker, commit kclient.CommittedOffset, have bool) {
	if c.bound != nil {
		c.bound(w, commit, have)
	}
}

func (c claimCommits) end(w *partition.Worker, watch *epochWatch) {
	if c.ended != nil {
		c.ended(markedPosition(w, watch))
	}
}

func (c claimCommits) done() {
	if c.release != nil {
		c.release()
	}
}
