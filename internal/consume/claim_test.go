package consume

import (
	"testing"

	"github.com/safeack/safeack/internal/kclient"
)

// TestClaimStartTakenOnce: a session's first claim of a partition takes
// what the session's start found for it, whole; a later claim of it in
// the session (added back by a cooperative rebalance) finds nothing and
// reads its commit on its own. Partitions whose claims wait for their
// leaders (held) get no commit from the start either.
func TestClaimStartTakenOnce(t *testing.T) {
	t.Parallel()
	var h member
	ff := &firstFetch{from: 5}
	h.prepareClaims([]int32{0, 1, 2, 3}, sessionStart{
		committed: map[int32]kclient.CommittedOffset{0: {Offset: 5}, 1: {Offset: 7, Metadata: "m"}, 3: {Offset: 9}},
		truncated: map[int32]bool{0: true},
		unchecked: map[int32]bool{1: true},
		pinned:    closedChan,
	}, map[int32]bool{3: true}, map[int32]*firstFetch{0: ff})

	if st := h.takeClaimStart(0); !st.fromSetup || st.committed.Offset != 5 || !st.truncated || st.unchecked || st.first != ff {
		t.Errorf("first claim of 0: %+v", st)
	}
	if st := h.takeClaimStart(0); st != (claimStart{}) {
		t.Errorf("second claim of 0 in the session: %+v, want nothing", st)
	}
	if st := h.takeClaimStart(1); !st.fromSetup || st.committed != (kclient.CommittedOffset{Offset: 7, Metadata: "m"}) || !st.unchecked || st.truncated {
		t.Errorf("claim of 1: %+v", st)
	}
	if st := h.takeClaimStart(2); st.fromSetup {
		t.Errorf("claim of 2, without a commit: %+v", st)
	}
	if st := h.takeClaimStart(3); st.fromSetup {
		t.Errorf("claim of 3, held for its leader: %+v", st)
	}
}

// TestClaimStartCountsEachTruncationOnce: a truncation found by a session's
// start whose claim of the partition did not run, or by an added claim's
// check (which ends the session), is counted by the next claim of the
// partition: in the same session, or the next session that claims it.
// One that the next session does not claim is dropped there: that
// session's start checks its partitions itself.
func TestClaimStartCountsEachTruncationOnce(t *testing.T) {
	t.Parallel()
	var h member
	h.prepareClaims([]int32{3, 6}, sessionStart{
		committed: map[int32]kclient.CommittedOffset{3: {Offset: 1}, 6: {Offset: 1}},
		truncated: map[int32]bool{3: true, 6: true},
	}, nil, nil)
	// Added claims' checks found truncations (checkAddedClaim).
	h.truncatedAdded = withPartition(withPartition(h.truncatedAdded, 4), 7)
	if st := h.takeClaimStart(7); !st.truncated {
		t.Errorf("claim of 7 in the session its truncation was found in: %+v, want truncated", st)
	}
	if st := h.takeClaimStart(7); st.truncated {
		t.Errorf("second claim of 7: %+v, counted twice", st)
	}

	// The next session claims 3 and 4, not 6; no claim of 3 ran.
	h.prepareClaims([]int32{3, 4, 5}, sessionStart{}, nil, nil)
	for p, want := range map[int32]bool{3: true, 4: true, 5: false} {
		if st := h.takeClaimStart(p); st.truncated != want {
			t.Errorf("next session's claim of %d: truncated %v, want %v", p, st.truncated, want)
		}
	}
	h.prepareClaims([]int32{6}, sessionStart{}, nil, nil)
	if st := h.takeClaimStart(6); st.truncated {
		t.Errorf("claim of 6 two sessions later: %+v, want its truncation dropped", st)
	}
}
