package frontier

// WindowRun is a maximal run of consecutive retained records that are all
// unfinished or all completed. Runs describe the retained window of a
// Tracker, the records between its safe offset and its delivered position,
// for displays and diagnostics.
type WindowRun struct {
	// From is the offset of the run's first record. To is where the next
	// run starts or, for the last run, the resume position of its last
	// record: the offsets [From, To) include the holes (offsets never
	// delivered) after the run's records.
	From, To int64
	// Records counts the delivered records in the run.
	Records int
	// Done reports whether the run's records completed (and are blocked
	// behind an unfinished one) rather than unfinished.
	Done bool
}

// AppendWindow appends to dst the retained records, oldest first, as runs
// of unfinished and completed records, and returns the extended slice. The
// first run, when there is one, is unfinished: it starts at the oldest
// unfinished record. Consecutive runs alternate between unfinished and
// completed and tile the offsets from the first record on.
//
// It looks at no more than maxEntries retained records (all of them when
// maxEntries <= 0) and reports in more whether some were left out; the last
// run then ends after the last record looked at. It costs
// O(min(retained, maxEntries)) and allocates only when dst must grow. After
// Revoke nothing is retained and it appends nothing.
func (t *Tracker) AppendWindow(dst []WindowRun, maxEntries int) (runs []WindowRun, more bool) {
	n := t.tail - t.head
	if maxEntries > 0 && uint64(maxEntries) < n {
		n, more = uint64(maxEntries), true
	}
	open := false
	var cur WindowRun
	for s := t.head; s != t.head+n; s++ {
		e := t.ring[s&t.mask]
		done := e.offset < 0
		off := e.offset &^ doneBit
		if open && done != cur.Done {
			cur.To = off
			dst = append(dst, cur)
			open = false
		}
		if !open {
			cur = WindowRun{From: off, Done: done}
			open = true
		}
		cur.Records++
		cur.To = e.resume
	}
	if open {
		dst = append(dst, cur)
	}
	return dst, more
}
