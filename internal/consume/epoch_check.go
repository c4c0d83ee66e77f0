package consume

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kclient"
)

// The leader-epoch check of committed positions (KIP-320, as Kafka's own
// consumer does it).
//
// An unclean leader election, or a follower that became leader behind the
// old one, truncates a partition's log: offsets the group committed, or
// listed as completed in a tail, then name other records, produced after
// the truncation. Trusting the commit would skip those records. Each mark
// carries the partition's leader epoch in its metadata (frontier
// AppendTailEpoch; Sarama's OffsetCommit has the field, but Sarama commits
// back whatever epoch it read). On start, Setup asks the partition leader
// where that epoch ends in its log (OffsetForLeaderEpoch); an end below the
// committed offset means the log diverged there: the start moves back to
// that end and the completed tail is dropped, so every record the log now
// holds from there on is handled. An end above the committed offset but
// inside the completed tail cuts the tail there (cutTail): its entries at
// or past the end name records the log no longer holds. A check that
// cannot run trusts the commit; when trying again may cure that, the
// claim's epochWatch checks the commit's epoch while it consumes.
//
// The same check while the partition is consumed: epoch_watch.go;
// OffsetForLeaderEpoch through franz-go: epoch_client.go.

// epochCheckTimeout bounds the leader-epoch check of one session's start:
// it runs in Setup, which the whole group waits for.
const epochCheckTimeout = 5 * time.Second

// epochAnswer is what the partition leader says of a committed epoch.
type epochAnswer struct {
	endOffset int64 // where the epoch ends in the leader's log; -1 unknown
	err       error // the check could not run for this partition
	// final: err will not go away by trying again (no client can be
	// made for the config, a non-retriable error such as a refused ACL
	// or an unsupported request).
	final bool
}

// checkLeaderEpochs validates the committed positions that carry a leader
// epoch, before Sarama starts the claims: a position whose epoch ends below
// its offset in the log now is moved back to that end (not below the log
// start), without its tail, and noted in truncated. A check that cannot run
// leaves the position as it was, with a log line; when trying again may
// cure its failure (no answer in time, a retriable error) the partition is
// noted in unchecked, and its claim's epochWatch checks the commit while
// consuming (see newEpochWatch). One that can never run (no client for the
// config, a refused ACL, an unsupported request) is not tried again.
func (h *member) checkLeaderEpochs(sess groupSession, committed map[int32]kclient.CommittedOffset) (truncated, unchecked map[int32]bool) {
	epochs := make(map[int32]int32)
	for p, c := range committed {
		if c.Offset < 0 {
			continue
		}
		if e, ok := frontier.LeaderEpochOf(c.Metadata); ok {
			epochs[p] = e
		}
	}
	if len(epochs) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(sess.Context(), epochCheckTimeout)
	defer cancel()
	began := time.Now()
	answers := h.epochs.offsetForLeaderEpoch(ctx, h.sub.topic, epochs)
	h.sub.logger.Debug("Checked the committed leader epochs against the log", h.sub.logFields.Add(watermill.LogFields{
		"partitions": len(epochs), "took": time.Since(began).String(),
	}))
	for p, epoch := range epochs {
		c := committed[p]
		fields := h.sub.logFields.Add(watermill.LogFields{
			"kafka_partition": p, "committed": c.Offset, "committed_leader_epoch": epoch,
		})
		a, ok := answers[p]
		switch {
		case !ok || a.err != nil:
			if ok {
				fields["err"] = a.err.Error()
			}
			if ok && a.final {
				h.sub.logger.Info("Cannot check the committed position against the log's leader epochs; trusting it as it is", fields)
				continue
			}
			unchecked = withPartition(unchecked, p)
			h.sub.logger.Info("Cannot check the committed position against the log's leader epochs now; "+
				"starting from it, and checking it while the partition is consumed", fields)
			continue
		case a.endOffset < 0:
			h.sub.logger.Info("The partition leader knows no end for the committed leader epoch; trusting the committed position as it is", fields)
			continue
		case a.endOffset >= c.Offset:
			// The committed offset is in the log; the completed tail
			// may still reach past the divergence: its entries there name
			// records the log no longer holds, and the records now at
			// those offsets were never handled.
			meta, dropped := cutTail(c.Offset, c.Metadata, a.endOffset, h.sub.cfg.TailMetadataBudget)
			if dropped == 0 {
				continue
			}
			sess.ResetOffset(h.sub.topic, p, c.Offset, meta) // same offset: rewrites the metadata
			committed[p] = kclient.CommittedOffset{Offset: c.Offset, Metadata: meta}
			truncated = withPartition(truncated, p)
			h.sub.logger.Error("The partition's log was truncated inside the group's completed tail (unclean leader election?); "+
				"handling the records from where it diverged again",
				errLogTruncated, fields.Add(watermill.LogFields{
					"kafka_topic": h.sub.topic, "epoch_end_offset": a.endOffset, "dropped_tail_offsets": dropped,
				}))
			continue
		}
		start := a.endOffset
		if first, err := h.reads.LogStart(p); err == nil && first > start {
			start = first // a start below the log's would fall back to Offsets.Initial
		}
		tail, _ := frontier.DecodeTail(c.Metadata, c.Offset)
		sess.ResetOffset(h.sub.topic, p, start, "")
		committed[p] = kclient.CommittedOffset{Offset: start}
		truncated = withPartition(truncated, p)
		h.sub.logger.Error("The partition's log was truncated under the group's commit (unclean leader election?); "+
			"starting again where it diverged, and handling the completed tail's records again",
			errLogTruncated, fields.Add(watermill.LogFields{
				"kafka_topic": h.sub.topic, "epoch_end_offset": a.endOffset, "start": start,
				"dropped_tail_offsets": tail.Len(),
			}))
	}
	return truncated, unchecked
}

// errLogTruncated is the error logged with a detected truncation.
var errLogTruncated = errors.New("safeack: committed offset is past the end of its leader epoch in the log")
