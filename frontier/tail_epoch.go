package frontier

// The leader-epoch envelope of the completed-tail codec (version 2; the
// grammar is in the package doc). Kafka's own consumer commits, with each
// offset, the leader epoch of the last record it consumed, and on start asks
// the partition leader where that epoch ends (OffsetForLeaderEpoch,
// KIP-320): an end below the committed offset means the log was truncated
// under the commit, and the offsets above the end now name other records.
// Sarama commits back whatever epoch it read, so the epoch rides in the
// metadata instead.

import (
	"math"
	"strconv"
)

// NoLeaderEpoch stands for an unknown leader epoch: AppendTailEpoch then
// writes version 1 metadata (or "" for an empty tail), as AppendTail does.
const NoLeaderEpoch int32 = -1

const tailTagV2 = "sa2:"

// AppendTailEpoch is AppendTail with the leader epoch of the records below
// base recorded beside the tail (see LeaderEpochOf). With a non-negative
// epoch the metadata is never empty: an empty tail, or one that does not
// fit, still carries the epoch, which has priority over the ranges (it
// protects the committed offset; the ranges only save work). The returned
// bound is as for AppendTail. A budget too small even for the epoch, or a
// negative epoch, yields AppendTail's output.
func AppendTailEpoch(dst []byte, base int64, ranges []Range, budget int, epoch int32) ([]byte, int64, error) {
	if epoch < 0 {
		return AppendTail(dst, base, ranges, budget)
	}
	var num [10]byte
	digits := strconv.AppendInt(num[:0], int64(epoch), 10)
	head := len(tailTagV2) + len(digits)
	if budget < head {
		return AppendTail(dst, base, ranges, budget)
	}
	start := len(dst)
	dst = append(dst, tailTagV2...)
	dst = append(dst, digits...)
	if len(ranges) == 0 {
		out, bound, err := AppendTail(dst, base, ranges, 0) // validates base
		if err != nil {
			return out[:start], 0, err
		}
		return out, bound, nil
	}
	// The version 1 text is "sa1:" kind payload; version 2 puts ":" kind
	// payload after the epoch: the same payload, len(digits)+1 bytes more.
	tailAt := len(dst)
	out, bound, err := AppendTail(dst, base, ranges, budget-len(digits)-1)
	if err != nil {
		return out[:start], 0, err
	}
	if len(out) == tailAt { // nothing fitted: the epoch alone
		return out, bound, nil
	}
	// Replace the version 1 tag by ":".
	n := copy(out[tailAt:], ":")
	n += copy(out[tailAt+n:], out[tailAt+len(tailTag):])
	return out[:tailAt+n], bound, nil
}

// EncodeTailEpoch is AppendTailEpoch returning a string.
func EncodeTailEpoch(base int64, ranges []Range, budget int, epoch int32) (string, int64, error) {
	out, bound, err := AppendTailEpoch(nil, base, ranges, budget, epoch)
	if err != nil {
		return "", 0, err
	}
	return string(out), bound, nil
}

// LeaderEpochOf returns the leader epoch recorded in metadata written by
// AppendTailEpoch, and false for anything else: version 1, "", another
// client's metadata, or a malformed epoch. It reads the epoch only; the tail
// is DecodeTail's.
func LeaderEpochOf(metadata string) (int32, bool) {
	epoch, _, ok := tailSplitEpoch(metadata)
	return epoch, ok
}

// tailSplitEpoch parses the version 2 envelope: the epoch, and the rest
// ("" or ":" kind payload).
func tailSplitEpoch(meta string) (epoch int32, rest string, ok bool) {
	if len(meta) <= len(tailTagV2) || meta[:len(tailTagV2)] != tailTagV2 {
		return NoLeaderEpoch, "", false
	}
	s := meta[len(tailTagV2):]
	i := 0
	for i < len(s) && i < 11 && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	if i == 0 || (i > 1 && s[0] == '0') || (i < len(s) && s[i] != ':') {
		return NoLeaderEpoch, "", false
	}
	v, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil || v > math.MaxInt32 {
		return NoLeaderEpoch, "", false
	}
	return int32(v), s[i:], true
}

// tailDecodeV2 decodes version 2 metadata: the tail after the epoch.
func tailDecodeV2(meta string, base int64) (Tail, error) {
	_, rest, ok := tailSplitEpoch(meta)
	if !ok {
		return Tail{}, tailCorrupt("bad leader epoch in %s", tailSnippet(meta))
	}
	if rest == "" {
		return Tail{Base: base, Bound: base}, nil
	}
	if rest == ":" {
		return Tail{}, tailCorrupt("missing encoding letter")
	}
	return tailDecode(tailTag+rest[1:], base)
}
