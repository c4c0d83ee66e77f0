package frontier

// CompletedRuns exposes the tracker's count of completed runs (the ranges
// AppendCompleted returns) to the model test.
func CompletedRuns(t *Tracker) int { return t.runs }

// Revoked and Delivered read the tracker's state for the tests without a
// Stats snapshot; the library needs neither (Stats carries both), so they
// are not part of the package's API.

// Revoked reports whether Revoke was called.
func (t *Tracker) Revoked() bool { return t.revoked }

// Delivered returns the position after the last offered batch.
func (t *Tracker) Delivered() int64 { return t.delivered }
