package safeack_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// giveBackLock is the acquisition lock of the give-back tests: the
// embedded broker's config, a group config on a real one (where the
// broker's default is 30 s).
const giveBackLock = 4 * time.Second

// stuckHandlers takes every message of msgs and never answers it, as
// handlers would that hang on a stuck downstream; held returns them, and
// release acks them (at the test's end).
type stuckHandlers struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func hang(msgs <-chan *message.Message) *stuckHandlers {
	s := &stuckHandlers{}
	go func() {
		for m := range msgs {
			s.mu.Lock()
			s.msgs = append(s.msgs, m)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *stuckHandlers) held() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := make(map[string]bool, len(s.msgs))
	for _, m := range s.msgs {
		vs[string(m.Payload)] = true
	}
	return vs
}

func (s *stuckHandlers) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.msgs {
		m.Ack()
	}
}

// TestShareStuckMemberGivesBack (issue 42): member A of a share group
// (MaxInFlight 4, the rest default) has handlers that hang on the 4
// messages it handed out; B joins with the defaults. Every record A did
// not hand out reaches B within one acquisition lock (plus a margin for
// B's first assignment): A gives back what waited half a lock with no
// handler about to take it, renews only the locks of the 4 its handlers
// hold, and does not poll again while they stay stuck.
func TestShareStuckMemberGivesBack(t *testing.T) {
	t.Parallel()
	c, topic, group := shareTopicWithLock(t, giveBackLock)
	const n = 200
	produced := c.ProduceN(t, topic, 1, n, nil)

	a := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxInFlight = 4
		cfg.MaxPollRecords = 0 // the default, 4 x MaxInFlight
	})
	stuck := hang(subscribeShare(t, a, topic))
	kafkatest.WaitFor(t, 30*time.Second, "A's handlers holding 4 messages, more records taken", func() bool {
		tot, _ := shareTotals(a)
		return len(stuck.held()) == 4 && tot.Received > 4
	})
	took, _ := shareTotals(a)

	b := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) { cfg.MaxInFlight = 0 })
	seen := answerAll(subscribeShare(t, b, topic), (*message.Message).Ack)
	joined := time.Now()
	// B gets its assignment with a heartbeat (500 ms here) and long-polls:
	// a few seconds of margin on a loaded machine.
	const margin = 5 * time.Second
	kafkatest.WaitFor(t, giveBackLock+margin, "every record A did not hand out handled by B", func() bool {
		return seen.distinct() == n-4
	})
	t.Logf("B had them all %v after it joined; A had taken %d records", time.Since(joined).Round(time.Millisecond), took.Received)

	held := stuck.held()
	require.Len(t, held, 4, "A's handlers got more messages while stuck")
	for _, p := range produced {
		v := string(p.Value)
		assert.True(t, held[v] != (seen.count(v) == 1), "record %s: held by A %v, handled by B %d times", v, held[v], seen.count(v))
	}
	totA, inFlight := shareTotals(a)
	t.Logf("A: %+v", totA)
	assert.Equal(t, 4, inFlight, "A's messages in flight")
	assert.NotZero(t, totA.GivenBack, "A gave back nothing")
	assert.Equal(t, totA.GivenBack, totA.Released, "A released records other than those it gave back")
	assert.Zero(t, totA.Accepted, "A accepted records its handlers never answered")
	assert.Zero(t, totA.AckErrors, "A's acknowledgements refused")

	// The stuck handlers kept their records: their locks were renewed, and
	// B never saw them.
	stuck.release()
	kafkatest.WaitFor(t, 10*time.Second, "A's 4 records accepted", func() bool {
		tot, _ := shareTotals(a)
		return tot.Accepted == 4
	})
	totA, _ = shareTotals(a)
	assert.Zero(t, totA.AckErrors, "A's late acks refused: its held records' locks ran out")
}

// TestShareStuckProcessOthersFinishBacklog (issue 42): four processes
// share one partition and one of them is stuck (its handlers hang on what
// they got): the other three handle the whole backlog but the stuck one's
// handed-out messages; nothing of it stays hoarded in the stuck process.
func TestShareStuckProcessOthersFinishBacklog(t *testing.T) {
	t.Parallel()
	c, topic, group := shareTopicWithLock(t, giveBackLock)
	const n = 600
	c.ProduceN(t, topic, 1, n, nil)

	subs := make([]*safeack.ShareSubscriber, 4)
	for i := range subs {
		subs[i] = newShareSub(t, c, group, nil)
	}
	// Subscribed at once, so that the stuck one takes its share.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	chans := make([]<-chan *message.Message, len(subs))
	for i, s := range subs {
		ch, err := s.Subscribe(ctx, topic)
		require.NoError(t, err)
		chans[i] = ch
	}
	stuck := hang(chans[0])
	seen := newShareSeen()
	for _, ch := range chans[1:] {
		go func() {
			for m := range ch {
				seen.add(m)
				m.Ack()
			}
		}()
	}
	kafkatest.WaitFor(t, 60*time.Second, "the backlog handled by the three", func() bool {
		return seen.distinct()+len(stuck.held()) == n
	})
	held := stuck.held()
	totStuck, inFlight := shareTotals(subs[0])
	t.Logf("stuck process: %d held, %+v", len(held), totStuck)
	assert.Equal(t, len(held), inFlight, "the stuck process's messages in flight")
	assert.LessOrEqual(t, len(held), 16, "the stuck process's handlers got more than MaxInFlight")
	for v := range held {
		assert.Zero(t, seen.count(v), "record %s held by the stuck process and handled by another", v)
	}
	stuck.release()
}
