// Package safeacktest builds the Subscriber that the tests of the packages
// around safeack (metrics, otel) run on a kafkatest cluster, and holds the
// output of the programs their tests run (Buffer), and dead-letters a
// record for their counters (DeadLetterOne). It is apart
// from kafkatest because package safeack's own internal tests import
// kafkatest: kafkatest cannot import safeack.
package safeacktest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Logger is the tests' logger: silent unless SAFEACK_TEST_DEBUG is set.
func Logger() watermill.LoggerAdapter {
	if os.Getenv("SAFEACK_TEST_DEBUG") != "" {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}

// Config returns the config of an Unordered member of group on c with the
// short timings of these tests (300 ms heartbeats, 10 ms before a nacked
// record is resent, 100 ms between reconnects, 300 ms to drain, commits
// every 50 ms). mod, when not nil, changes it (its OverwriteSaramaConfig
// included).
func Config(c *kafkatest.Cluster, group string, mod func(*safeack.SubscriberConfig)) safeack.SubscriberConfig {
	sc := c.SaramaConfig()
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	cfg := safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		Ordering:              safeack.Unordered,
		NackResendSleep:       10 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
		DrainTimeout:          300 * time.Millisecond,
		CommitInterval:        50 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

// NewSubscriber returns a Subscriber of Config(c, group, mod), closed at
// cleanup.
func NewSubscriber(tb testing.TB, c *kafkatest.Cluster, group string, mod func(*safeack.SubscriberConfig)) *safeack.Subscriber {
	tb.Helper()
	sub, err := safeack.NewSubscriber(Config(c, group, mod), Logger())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sub.Close() })
	return sub
}

// Buffer is an io.Writer that a process's or a goroutine's output can be
// written to while the test reads it: its methods are safe for concurrent
// use. Its zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// DeadLetterOne runs sub on topic (of one partition) under a router whose
// handler fails the record at offset 1 of three, with safeack.PoisonQueue
// publishing to an in-process Watermill channel, and returns once sub's
// Totals count that one dead letter and every record is completed. The
// router stops at cleanup.
func DeadLetterOne(tb testing.TB, c *kafkatest.Cluster, sub *safeack.Subscriber, topic string) {
	tb.Helper()
	dlq := gochannel.NewGoChannel(gochannel.Config{}, nil)
	tb.Cleanup(func() { _ = dlq.Close() })
	poison, err := safeack.PoisonQueue(dlq, topic+".dlq")
	if err != nil {
		tb.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, Logger())
	if err != nil {
		tb.Fatal(err)
	}
	router.AddMiddleware(poison)
	router.AddConsumerHandler("h", topic, sub, func(m *message.Message) error {
		if off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context()); off == 1 {
			return errors.New("poison")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = router.Run(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
	})
	c.ProduceN(tb, topic, 1, 3, nil)
	kafkatest.WaitFor(tb, 30*time.Second, "one dead letter and three completed records in Totals", func() bool {
		for _, pt := range sub.Totals() {
			if pt.Topic == topic && pt.DeadLettered == 1 && pt.Completed == 3 {
				return true
			}
		}
		return false
	})
}
