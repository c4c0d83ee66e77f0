package safeack_test

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestWindowsAndTotals holds two records of a partition unacked and checks
// the retained window Windows draws, then that Totals keep counting across
// a second assignment of the partition to the same Subscriber.
func TestWindowsAndTotals(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	c.ProduceN(t, topic, 1, 10, nil)

	sc := c.SaramaConfig()
	sc.Consumer.Return.Errors = true
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		Ordering:              safeack.Unordered,
		DrainTimeout:          200 * time.Millisecond,
		CommitInterval:        50 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	if w := sub.Windows(0); len(w) != 0 {
		t.Fatalf("Windows before Subscribe: %+v", w)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []*message.Message
	go func() {
		for m := range msgs {
			off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
			if off == 2 || off == 6 {
				mu.Lock()
				held = append(held, m)
				mu.Unlock()
				continue
			}
			m.Ack()
		}
	}()
	kafkatest.WaitFor(t, 30*time.Second, "8 of 10 records completed", func() bool {
		st := sub.Stats()
		return len(st) == 1 && st[0].Delivered == 10 && st[0].Completed == 8 && st[0].InFlight == 2
	})

	ws := sub.Windows(0)
	want := safeack.PartitionWindow{
		TopicPartition: safeack.TopicPartition{Topic: topic, Partition: 0},
		SafeOffset:     2, Delivered: 10, Retained: 8, Blocked: 6,
		Runs: []safeack.WindowRun{
			{From: 2, To: 3, Records: 1},
			{From: 3, To: 6, Records: 3, Done: true},
			{From: 6, To: 7, Records: 1},
			{From: 7, To: 10, Records: 3, Done: true},
		},
	}
	if len(ws) != 1 || !reflect.DeepEqual(ws[0], want) {
		t.Fatalf("Windows(0) = %+v; want %+v", ws, want)
	}
	ws = sub.Windows(3)
	want.Runs, want.Truncated = []safeack.WindowRun{{From: 2, To: 3, Records: 1}, {From: 3, To: 5, Records: 2, Done: true}}, true
	if len(ws) != 1 || !reflect.DeepEqual(ws[0], want) {
		t.Fatalf("Windows(3) = %+v; want %+v", ws, want)
	}

	tot := sub.Totals()
	if len(tot) != 1 || !tot[0].Owned || tot[0].Assignments != 1 || tot[0].Offered != 10 || tot[0].Completed != 8 {
		t.Fatalf("Totals during the first assignment: %+v", tot)
	}

	// End the assignment with the two records held, then take the
	// partition again: it resumes at 2, and the totals add up.
	cancel()
	kafkatest.WaitFor(t, 10*time.Second, "the partition to be released", func() bool { return len(sub.Stats()) == 0 })
	if tot = sub.Totals(); len(tot) != 1 || tot[0].Owned || tot[0].Offered != 10 {
		t.Fatalf("Totals after the assignment ended: %+v", tot)
	}
	mu.Lock()
	for _, m := range held {
		m.Ack() // too late: changes nothing
	}
	mu.Unlock()

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	msgs, err = sub.Subscribe(ctx2, topic)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			m.Ack()
		}
	}()
	kafkatest.WaitFor(t, 30*time.Second, "the second assignment to complete the partition", func() bool {
		st := sub.Stats()
		return len(st) == 1 && st[0].SafeOffset == 10
	})
	st := sub.Stats()[0]
	tot = sub.Totals()
	if len(tot) != 1 || !tot[0].Owned || tot[0].Assignments != 2 || tot[0].Offered != 10+st.Offered || tot[0].Completed != 8+st.Completed {
		t.Fatalf("Totals during the second assignment: %+v; its stats: %+v", tot, st)
	}
	if ws := sub.Windows(0); len(ws) != 1 || len(ws[0].Runs) != 0 || ws[0].SafeOffset != 10 {
		t.Fatalf("Windows with everything completed: %+v", ws)
	}
}
