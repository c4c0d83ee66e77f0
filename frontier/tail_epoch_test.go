package frontier

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestTailEpochRoundTrip(t *testing.T) {
	ranges := []Range{{12, 15}, {20, 21}}
	for _, epoch := range []int32{0, 7, math.MaxInt32} {
		meta, bound, err := EncodeTailEpoch(10, ranges, DefaultMetadataBudget, epoch)
		if err != nil || bound != math.MaxInt64 {
			t.Fatalf("EncodeTailEpoch(epoch %d) = %q, %d, %v", epoch, meta, bound, err)
		}
		if !strings.HasPrefix(meta, "sa2:") {
			t.Fatalf("metadata %q is not version 2", meta)
		}
		got, ok := LeaderEpochOf(meta)
		if !ok || got != epoch {
			t.Errorf("LeaderEpochOf(%q) = %d, %v; want %d", meta, got, ok, epoch)
		}
		tail, err := DecodeTail(meta, 10)
		if err != nil || !slices.Equal(tail.Ranges, ranges) || tail.Bound != math.MaxInt64 {
			t.Errorf("DecodeTail(%q) = %+v, %v", meta, tail, err)
		}
		// The same payload as version 1, behind the epoch.
		v1, _, _ := EncodeTail(10, ranges, DefaultMetadataBudget)
		if meta[strings.LastIndexByte(meta, ':')+1:] != v1[len("sa1:"):] {
			t.Errorf("version 2 %q does not carry version 1's payload %q", meta, v1)
		}
	}
}

func TestTailEpochWithoutRanges(t *testing.T) {
	meta, bound, err := EncodeTailEpoch(10, nil, DefaultMetadataBudget, 3)
	if err != nil || meta != "sa2:3" || bound != math.MaxInt64 {
		t.Fatalf("EncodeTailEpoch(no ranges) = %q, %d, %v; want \"sa2:3\"", meta, bound, err)
	}
	tail, err := DecodeTail(meta, 10)
	if err != nil || len(tail.Ranges) != 0 || tail.Contains(10) || tail.Contains(11) {
		t.Fatalf("DecodeTail(%q) = %+v, %v; want an empty tail", meta, tail, err)
	}
	if _, _, err := EncodeTailEpoch(-1, nil, DefaultMetadataBudget, 3); !errors.Is(err, ErrInvalidTail) {
		t.Errorf("negative base: %v, want ErrInvalidTail", err)
	}
}

// TestTailEpochBudget: the epoch has priority over the ranges, and the
// metadata never exceeds the budget.
func TestTailEpochBudget(t *testing.T) {
	var ranges []Range
	for i := int64(0); i < 2000; i++ {
		ranges = append(ranges, Range{From: 100 + 3*i, To: 101 + 3*i})
	}
	for budget := 0; budget < 300; budget++ {
		meta, bound, err := EncodeTailEpoch(100, ranges, budget, 123456)
		if err != nil {
			t.Fatalf("budget %d: %v", budget, err)
		}
		if len(meta) > budget {
			t.Fatalf("budget %d: %d bytes", budget, len(meta))
		}
		if budget >= len("sa2:123456") {
			if e, ok := LeaderEpochOf(meta); !ok || e != 123456 {
				t.Fatalf("budget %d: %q lost the epoch", budget, meta)
			}
		}
		tail, err := DecodeTail(meta, 100)
		if err != nil {
			t.Fatalf("budget %d: DecodeTail(%q): %v", budget, meta, err)
		}
		for _, r := range tail.Ranges {
			if r.To > bound {
				t.Fatalf("budget %d: range %v past bound %d", budget, r, bound)
			}
		}
	}
}

func TestLeaderEpochOfRejects(t *testing.T) {
	for _, meta := range []string{"", "sa1:rAA", "sa2:", "sa2:x", "sa2:-1", "sa2:01", "sa2:1x", "sa2:99999999999", "sa2:2147483648", "foreign", "sa20:1"} {
		if e, ok := LeaderEpochOf(meta); ok {
			t.Errorf("LeaderEpochOf(%q) = %d, true", meta, e)
		}
	}
}
