package figures

import (
	"fmt"
	"reflect"
	"time"
)

// The figures read plain values, not the root package's statistics types
// (this package is below the root and does not import it): an exporter
// turns what a Subscriber or ShareSubscriber reports into these with
// Views. Each field has the name and type of the field of the same name in
// the public type given beside it, promoted fields included; the test of
// this package checks that they all do.

// Partition is what the figures read of a safeack.PartitionStats.
type Partition struct {
	Topic                               string
	Partition                           int32
	SafeOffset, MarkedOffset            int64
	ConfirmedOffset, HighWaterMark, Lag int64
	Delivered                           int64
	Retained, Blocked, InFlight         int
	WaitingForKey                       int
	OldestUnfinished                    int64
	HasUnfinished                       bool
	OldestUnfinishedAge                 time.Duration
	Stuck, Paused                       bool
	TailBytes                           int
	TailTruncated                       bool
	AssignedAt                          time.Time
}

// Totals is what the figures read of a safeack.PartitionTotals.
type Totals struct {
	Topic                           string
	Partition                       int32
	Assignments, Offered, Completed uint64
	Redeliveries, UnmarshalFailures uint64
	SkippedTail, SkippedRevoked     uint64
	DeadLettered                    uint64
	IgnoredMetadata, LogTruncations uint64
	Deferred                        uint64
	PausedFor                       time.Duration
}

// Unclaimed is what the figures read of a safeack.UnclaimedPartition.
type Unclaimed struct {
	Topic     string
	Partition int32
	Since     time.Time
}

// Share is what the figures read of a safeack.ShareStats.
type Share struct {
	Topic                             string
	Partition                         int32
	InFlight                          int
	OldestInFlight                    int64
	OldestInFlightAge                 time.Duration
	Received, Redelivered             uint64
	MaxDeliveryCount                  int32
	Accepted, Released, Rejected      uint64
	DeadLettered, ReleasedAtClose     uint64
	SkippedClosing, UnmarshalFailures uint64
	Deferred, LockRenewals, AckErrors uint64
	GivenBack                         uint64
}

// Views returns, for each of stats, the view V whose every field is the
// field of the same name of S (a promoted field of an embedded struct
// included). It panics when S lacks one or has it with another type: a
// programming error the package's test rules out for the pairs above.
func Views[V, S any](stats []S) []V {
	idx, err := viewIndex(reflect.TypeFor[V](), reflect.TypeFor[S]())
	if err != nil {
		panic(err)
	}
	out := make([]V, len(stats))
	for i := range stats {
		src := reflect.ValueOf(&stats[i]).Elem()
		dst := reflect.ValueOf(&out[i]).Elem()
		for f, path := range idx {
			dst.Field(f).Set(src.FieldByIndex(path))
		}
	}
	return out
}

// viewIndex returns, for each field of view, the index path of the field
// of the same name and type in src.
func viewIndex(view, src reflect.Type) ([][]int, error) {
	idx := make([][]int, view.NumField())
	for i := range idx {
		vf := view.Field(i)
		sf, ok := src.FieldByName(vf.Name)
		if !ok {
			return nil, fmt.Errorf("figures: %v has no field %s for %v", src, vf.Name, view)
		}
		if sf.Type != vf.Type {
			return nil, fmt.Errorf("figures: %v.%s is %v; %v wants %v", src, vf.Name, sf.Type, view, vf.Type)
		}
		idx[i] = sf.Index
	}
	return idx, nil
}
