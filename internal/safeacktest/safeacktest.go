// Package safeacktest builds the Subscriber that the tests of the packages
// around safeack (metrics, otel) run on a kafkatest cluster, and holds the
// output of the programs their tests run (Buffer). It is apart
// from kafkatest because package safeack's own internal tests import
// kafkatest: kafkatest cannot import safeack.
package safeacktest

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

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
