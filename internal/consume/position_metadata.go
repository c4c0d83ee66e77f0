package consume

import "github.com/safeack/safeack/frontier"

// Edits of a committed position's metadata (its completed tail and leader
// epoch), shared by the leader-epoch checks and the transactional marks.

// cutTail returns the metadata of a position at offset whose completed
// tail (meta, relative to offset) is cut at at: the entries at or above it
// are dropped, the leader epoch is kept. dropped counts the offsets the
// entries dropped covered (0: meta is returned as it was). Metadata that
// does not decode is returned as it was: the worker ignores it anyway.
func cutTail(offset int64, meta string, at int64, budget int) (string, int64) {
	tail, err := frontier.DecodeTail(meta, offset)
	if err != nil || len(tail.Ranges) == 0 || tail.Ranges[len(tail.Ranges)-1].To <= at {
		return meta, 0
	}
	kept, dropped := cutRanges(tail.Ranges, at)
	epoch, ok := frontier.LeaderEpochOf(meta)
	if !ok {
		epoch = frontier.NoLeaderEpoch
	}
	out, _, err := frontier.EncodeTailEpoch(offset, kept, budget, epoch)
	if err != nil {
		out = "" // the ranges kept are valid by construction; if not, the offset alone
	}
	return out, dropped
}

// cutRanges returns the completed ranges (sorted) cut at at: those below
// it, a range across it shortened to end there. dropped counts the
// offsets cut off.
func cutRanges(ranges []frontier.Range, at int64) (kept []frontier.Range, dropped int64) {
	for _, r := range ranges {
		switch {
		case r.To <= at:
			kept = append(kept, r)
		case r.From < at:
			kept = append(kept, frontier.Range{From: r.From, To: at})
			dropped += r.To - at
		default:
			dropped += r.To - r.From
		}
	}
	return kept, dropped
}

// positionEnd is the offset after everything a position covers: its
// offset, and its completed tail (meta) above it.
func positionEnd(offset int64, meta string) int64 {
	end := max(offset, 0)
	if tail, err := frontier.DecodeTail(meta, end); err == nil && len(tail.Ranges) > 0 {
		end = max(end, tail.Ranges[len(tail.Ranges)-1].To)
	}
	return end
}

// withLeaderEpoch returns the metadata of the position at offset (meta)
// with epoch in place of its leader epoch; its completed tail is kept
// (cut to the budget as any tail is).
func withLeaderEpoch(offset int64, meta string, epoch int32, budget int) string {
	tail, err := frontier.DecodeTail(meta, offset)
	if err != nil {
		return meta
	}
	out, _, err := frontier.EncodeTailEpoch(offset, tail.Ranges, budget, epoch)
	if err != nil {
		return meta
	}
	return out
}

// CommittedTail is the completed tail a commit at offset with metadata
// carries: empty when the metadata does not decode (it then covers less,
// never more).
func CommittedTail(offset int64, metadata string) frontier.Tail {
	tail, _ := frontier.DecodeTail(metadata, offset)
	return tail
}
