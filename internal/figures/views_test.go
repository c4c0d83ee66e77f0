package figures_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
)

// TestViews checks that every view's fields are the public type's, and
// that Views copies them, promoted fields included.
func TestViews(t *testing.T) {
	at := time.Unix(1700000000, 0)
	p := figures.Views[figures.Partition]([]safeack.PartitionStats{{
		TopicPartition: safeack.TopicPartition{Topic: "t", Partition: 3},
		SafeOffset:     7, ConfirmedOffset: -1, HasUnfinished: true, OldestUnfinishedAge: time.Second,
		TailTruncated: true, AssignedAt: at,
	}})
	if want := (figures.Partition{Topic: "t", Partition: 3, SafeOffset: 7, ConfirmedOffset: -1, HasUnfinished: true,
		OldestUnfinishedAge: time.Second, TailTruncated: true, AssignedAt: at}); !reflect.DeepEqual(p[0], want) {
		t.Errorf("Partition view %+v; want %+v", p[0], want)
	}
	tot := figures.Views[figures.Totals]([]safeack.PartitionTotals{{
		TopicPartition:    safeack.TopicPartition{Topic: "t", Partition: 1},
		Assignments:       2,
		PartitionCounters: safeack.PartitionCounters{Offered: 5, PausedFor: time.Minute},
	}})
	if want := (figures.Totals{Topic: "t", Partition: 1, Assignments: 2, Offered: 5, PausedFor: time.Minute}); tot[0] != want {
		t.Errorf("Totals view %+v; want %+v", tot[0], want)
	}
	u := figures.Views[figures.Unclaimed]([]safeack.UnclaimedPartition{{
		TopicPartition: safeack.TopicPartition{Topic: "t", Partition: 2}, Since: at,
	}})
	if want := (figures.Unclaimed{Topic: "t", Partition: 2, Since: at}); u[0] != want {
		t.Errorf("Unclaimed view %+v; want %+v", u[0], want)
	}
	sh := figures.Views[figures.Share]([]safeack.ShareStats{{
		TopicPartition: safeack.TopicPartition{Topic: "t", Partition: 0}, InFlight: 4,
		ShareCounters: safeack.ShareCounters{MaxDeliveryCount: 3, AckErrors: 9},
	}})
	if want := (figures.Share{Topic: "t", InFlight: 4, MaxDeliveryCount: 3, AckErrors: 9}); sh[0] != want {
		t.Errorf("Share view %+v; want %+v", sh[0], want)
	}
}

func TestViewsPanicsOnAMissingField(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for a view field the source lacks")
		}
	}()
	figures.Views[figures.Share]([]safeack.PartitionStats{{}})
}
