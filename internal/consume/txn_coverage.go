package consume

import "github.com/safeack/safeack/frontier"

// coverage is what a committed position says is complete: every offset
// below offset, and the completed tail.
type coverage struct {
	offset int64
	tail   frontier.Tail
}

func coverageOf(offset int64, metadata string) coverage {
	tail, _ := frontier.DecodeTail(metadata, offset) // an error leaves it empty: covers less, never more
	return coverage{offset: offset, tail: tail}
}

func (c coverage) covers(offset int64) bool {
	return offset < c.offset || c.tail.Contains(offset)
}

// within reports whether next covers everything c does.
func (c coverage) within(next coverage) bool {
	if next.offset < c.offset {
		return false
	}
	for _, r := range c.tail.Ranges {
		from := max(r.From, next.offset)
		if from >= r.To {
			continue
		}
		if !next.coversRange(from, r.To) {
			return false
		}
	}
	return true
}

// cutAt is what c still covers once the log diverged at at (see
// txnMarker.diverge): nothing at or past it.
func (c coverage) cutAt(at int64) coverage {
	if c.offset >= at {
		return coverage{offset: at, tail: frontier.Tail{Base: at, Bound: at}}
	}
	t := c.tail
	kept, _ := cutRanges(t.Ranges, at)
	return coverage{offset: c.offset, tail: frontier.Tail{Base: t.Base, Bound: min(t.Bound, at), Ranges: kept}}
}

// coversRange reports whether the tail covers [from, to) whole (ranges are
// maximal, so one of them must).
func (c coverage) coversRange(from, to int64) bool {
	t := c.tail
	if to > t.Bound {
		return false
	}
	for _, r := range t.Ranges {
		if r.To > from {
			return r.From <= from && r.To >= to
		}
	}
	return false
}
