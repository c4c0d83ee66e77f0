package safeack_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestDefaultsRouterEndToEnd runs safeack the way a user first meets it:
// a SubscriberConfig naming only Brokers and ConsumerGroup (so Sarama's own
// defaults: OffsetNewest, its default protocol version, 10 s sessions, and
// safeack's: OrderByKey, DrainTimeout, MaxInFlight), fed by watermill-kafka's
// publisher with its key-less DefaultMarshaler, in a Watermill router with
// Watermill's plain PoisonQueue and Retry. It checks what the defaults
// promise:
//   - records published before the group existed are not handled (the
//     group starts at the end), and no commit goes below where it started;
//   - every record published after the group joined is handled; failing
//     ones go to the poison queue and are committed;
//   - no commit, at any time, passes a record whose handler had not
//     returned;
//   - a record still running at Close is not committed, and the next
//     member of the group (defaults again) gets it, and nothing else that
//     was already handled.
func TestDefaultsRouterEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		partitions = 4
		history    = 40
		working    = 160
	)
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	dlq := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	logger := testLogger()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: defaultsOn(c, kafka.DefaultSaramaSyncPublisherConfig)}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	publish := func(kind string, n int) map[string]bool {
		ids := make(map[string]bool, n)
		for range n {
			m := message.NewMessage(watermill.NewUUID(), []byte(kind))
			ids[m.UUID] = true
			require.NoError(t, pub.Publish(topic, m))
		}
		return ids
	}

	// History the group must never see: it starts at the newest offset.
	historyIDs := publish("history", history)
	floor := c.HighWaterMarks(t, topic)
	acks, watch := watchCommits(t, c, group, topic)
	watch.floor = floor
	// Records come from watermill-kafka's publisher, not the harness: a
	// partition's records are the offsets from the floor to its end.
	watch.records = func() map[int32][]int64 {
		out := make(map[int32][]int64)
		for p, hw := range c.HighWaterMarks(t, topic) {
			for o := floor[p]; o < hw; o++ {
				out[p] = append(out[p], o)
			}
		}
		return out
	}

	var mu sync.Mutex
	handled := map[string][]int{} // UUID → members that completed it
	heldStarted := make(chan string, 1)

	// member runs one router with a default subscriber; its handler fails
	// "fail" records, and holds "hold" records until their context ends.
	member := func(n int) (*safeack.Subscriber, *message.Router) {
		sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{Brokers: c.Brokers(), ConsumerGroup: group,
			OverwriteSaramaConfig: defaultsOn(c, safeack.DefaultSaramaSubscriberConfig)}, logger)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		router, err := message.NewRouter(message.RouterConfig{}, logger)
		require.NoError(t, err)
		poison, err := middleware.PoisonQueue(pub, dlq)
		require.NoError(t, err)
		// Outermost: note each record whose handling the router will ack,
		// before it acks (the commit check needs the ack time).
		record := func(h message.HandlerFunc) message.HandlerFunc {
			return func(m *message.Message) ([]*message.Message, error) {
				out, err := h(m)
				held := string(m.Payload) == "hold"
				if err == nil && !(held && n == 1) {
					k, ok := msgPO(m)
					if !ok {
						t.Errorf("message %s without partition and offset in its context", m.UUID)
					}
					acks.addAt(k, time.Now())
					mu.Lock()
					handled[m.UUID] = append(handled[m.UUID], n)
					mu.Unlock()
				}
				// Member 1's held record reaches the poison queue when
				// Close cancels its context (plain PoisonQueue cannot tell
				// a shutdown from a failure); its ack then comes after the
				// drain gave up, too late to count.
				return out, err
			}
		}
		router.AddMiddleware(
			record,
			poison,
			middleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond, Logger: logger}.Middleware,
		)
		router.AddConsumerHandler("work", topic, sub, func(m *message.Message) error {
			switch string(m.Payload) {
			case "fail":
				return errors.New("this record always fails")
			case "slow":
				time.Sleep(30 * time.Millisecond)
			case "hold":
				if n == 1 {
					heldStarted <- m.UUID
					<-m.Context().Done()
					return m.Context().Err()
				}
			default:
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			}
			return nil
		})
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, sub.WaitReady(ctx), "member %d never got its assignment", n)
		return sub, router
	}

	handledBy := func(id string) []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), handled[id]...)
	}
	waitHandled := func(ids map[string]bool, what string) {
		kafkatest.WaitFor(t, 30*time.Second, what, func() bool {
			for id := range ids {
				if len(handledBy(id)) == 0 {
					return false
				}
			}
			return true
		})
	}

	// Member 1: everything published after it joined is handled.
	sub1, router1 := member(1)
	okIDs := publish("ok", working)
	slowIDs := publish("slow", 10)
	failing := publish("fail", 10)
	waitHandled(okIDs, "member 1 to handle every ok record")
	waitHandled(slowIDs, "member 1 to handle every slow record")
	waitHandled(failing, "member 1 to pass every failing record to the poison queue")

	// Then one record it is still working on when it closes.
	heldIDs := publish("hold", 1)
	var heldID string
	select {
	case heldID = <-heldStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("the held record never reached its handler")
	}
	require.True(t, heldIDs[heldID])
	safeBefore := c.HighWaterMarks(t, topic)
	require.NoError(t, router1.Close())
	require.NoError(t, sub1.Close())

	// Nothing from before the group, and every commit within the handled
	// prefix, never below the group's start.
	for id := range historyIDs {
		require.Empty(t, handledBy(id), "a record published before the group existed was handled")
	}
	require.Positive(t, watch.check(t), "no commit observed")
	committed := watch.committed(t)
	heldAt := -1
	for p, hw := range safeBefore {
		if committed[p] < hw {
			require.Equal(t, -1, heldAt, "more than one partition left uncommitted: %v of %v", committed, safeBefore)
			heldAt = int(p)
			require.Equal(t, hw-1, committed[p], "partition %d: only the held record may be left", p)
		}
	}
	require.NotEqual(t, -1, heldAt, "the held record's partition was committed past it: %v", committed)

	// Member 2, defaults again, gets the held record and the new ones, and
	// nothing member 1 finished.
	_, _ = member(2)
	newIDs := publish("ok", 20)
	waitHandled(newIDs, "member 2 to handle the records published after member 1 left")
	waitHandled(map[string]bool{heldID: true}, "member 2 to get the record member 1 held at Close")
	mu.Lock()
	for id, by := range handled {
		if id == heldID || newIDs[id] {
			continue
		}
		require.Equal(t, []int{1}, by, "record %s finished by member 1 was handled again", id)
	}
	mu.Unlock()
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), 20*time.Second)
	require.Positive(t, watch.check(t))
}
