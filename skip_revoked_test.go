package safeack_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestMiddlewareSkipRevoked holds the handler start of member A's
// messages until a rebalance revokes their partitions: SkipRevoked then
// does not run the handler, nothing is acked or committed for them, and
// their partitions' new owners handle them. On the consumer protocol B
// takes one partition only; A's other record is skipped when A closes (its
// assignment ends there too), and B takes that partition then.
func TestMiddlewareSkipRevoked(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c, topic, group := kafkatest.StartTopic(t, partitions)
	commits := c.ObserveCommits(t)
	member := unorderedMember(t, c, group, 2*time.Second)

	var (
		mu      sync.Mutex
		held    = make(map[po]bool)
		handled = make(map[po][]string)
		done    = newDoneLog()
	)
	// holdFirst delays the first delivery of every record to A until its
	// assignment ends. The message context stays alive through the drain:
	// SkipRevoked must act on the assignment's end, not on the context.
	holdFirst := func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			k := mwOffset(t, m)
			mu.Lock()
			first := !held[k]
			held[k] = true
			mu.Unlock()
			if first {
				waitCond(mwWait, func() bool { return safeack.AssignmentEnded(m) })
				if m.Context().Err() != nil {
					t.Errorf("record %v: context cancelled when the drain started", k)
				}
			}
			return h(m)
		}
	}
	handler := func(name string) message.NoPublishHandlerFunc {
		return func(m *message.Message) error {
			k := mwOffset(t, m)
			mu.Lock()
			handled[k] = append(handled[k], name)
			mu.Unlock()
			done.done(k)
			return nil
		}
	}
	var aEvents, bEvents eventLog
	a := member()
	mwRouter(t, a, topic, handler("a"), safeack.Telemetry(aEvents.hook), holdFirst, safeack.SkipRevoked)
	c.ProduceN(t, topic, partitions, partitions, nil)
	kafkatest.WaitFor(t, mwWait, "A to hold one record per partition", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == partitions
	})

	b := member()
	mwRouter(t, b, topic, handler("b"), safeack.Telemetry(bEvents.hook), safeack.SkipRevoked)
	if envGroupProtocol == safeack.GroupProtocolConsumer {
		kafkatest.WaitFor(t, mwWait, "A to skip the record of the partition B took", func() bool {
			return len(ownedPartitions(b, topic)) == 1 && aEvents.count(safeack.OutcomeSkipped) == 1
		})
		require.NoError(t, a.Close())
	}
	want := map[int32]int64{0: 1, 1: 1}
	mwWaitCommitted(t, c, group, topic, want)

	mu.Lock()
	for p := int32(0); p < partitions; p++ {
		assert.Len(t, handled[po{p, 0}], 1, "record %d@0 handled by %v", p, handled[po{p, 0}])
	}
	byB := 0
	for _, who := range handled {
		if slices.Contains(who, "b") {
			byB++
		}
	}
	mu.Unlock()
	assert.Positive(t, byB, "the new owner B handled none of the skipped records")
	assert.Equal(t, partitions, aEvents.count(safeack.OutcomeSkipped), "A's telemetry: %v", aEvents.all())
	assert.Zero(t, bEvents.count(safeack.OutcomeSkipped))
	var skipped uint64
	for _, pt := range a.Totals() {
		if pt.Topic == topic {
			skipped += pt.SkippedRevoked
		}
	}
	assert.EqualValues(t, partitions, skipped, "Totals().SkippedRevoked of A")
	mwCheckCommits(t, commits, group, topic, done)
}
