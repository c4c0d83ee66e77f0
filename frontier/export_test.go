package frontier

// CompletedRuns exposes the tracker's count of completed runs (the ranges
// AppendCompleted returns) to the model test.
func CompletedRuns(t *Tracker) int { return t.runs }
