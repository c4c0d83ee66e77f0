package consume

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack/frontier"
)

// TestCutTail: a completed tail cut at a divergence point keeps its
// entries below it (a range across it is shortened), drops the others,
// keeps the leader epoch and the offset, and says how many offsets it
// dropped; a tail wholly below the point, or metadata that is no tail, is
// returned as it was.
func TestCutTail(t *testing.T) {
	t.Parallel()
	const base, epoch = 10, 7
	ranges := []frontier.Range{{From: 11, To: 14}, {From: 16, To: 20}, {From: 25, To: 30}}
	meta, _, err := frontier.EncodeTailEpoch(base, ranges, frontier.DefaultMetadataBudget, epoch)
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		at      int64
		want    []frontier.Range
		dropped int64
	}{
		{name: "inside a range", at: 18, want: []frontier.Range{{From: 11, To: 14}, {From: 16, To: 18}}, dropped: 2 + 5},
		{name: "between ranges", at: 22, want: []frontier.Range{{From: 11, To: 14}, {From: 16, To: 20}}, dropped: 5},
		{name: "at a range's start", at: 16, want: []frontier.Range{{From: 11, To: 14}}, dropped: 4 + 5},
		{name: "at the base", at: base, want: nil, dropped: 3 + 4 + 5},
		{name: "past the tail", at: 30, want: ranges, dropped: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, dropped := cutTail(base, meta, tc.at, frontier.DefaultMetadataBudget)
			require.Equal(t, tc.dropped, dropped)
			e, ok := frontier.LeaderEpochOf(got)
			require.True(t, ok, "the leader epoch was lost: %q", got)
			require.EqualValues(t, epoch, e)
			tail, err := frontier.DecodeTail(got, base)
			require.NoError(t, err)
			if len(tc.want) == 0 {
				require.Empty(t, tail.Ranges)
			} else {
				require.Equal(t, tc.want, tail.Ranges)
			}
			if dropped == 0 {
				require.Equal(t, meta, got, "an uncut tail is returned as it was")
			}
		})
	}

	for _, other := range []string{"", "not a tail", "sa2:7"} {
		got, dropped := cutTail(base, other, 12, frontier.DefaultMetadataBudget)
		require.Zero(t, dropped, "%q", other)
		require.Equal(t, other, got)
	}
}
