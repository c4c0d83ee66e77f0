package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestCleanShutdownLogsNoError closes routers normally, with Router.Close
// and by ending Run's context, at the defaults a user gets (Sarama's
// config, DrainTimeout), while records keep arriving, handlers run, and
// some handlers fail because the shutdown closes what they depend on
// (under safeack.PoisonQueue and Retry, as the README sets them up).
// Nothing is logged at ERROR, by safeack or by the router: an operator
// who greps a deploy's logs for ERROR finds only what needs a person.
func TestCleanShutdownLogsNoError(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	for _, how := range []string{"close", "context"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			for round := range 4 {
				// Odd rounds stop while records keep coming, even ones
				// once the partitions are idle (their fetches wait at the
				// broker for records).
				logs := cleanShutdownRound(t, c, how == "context", round%2 == 1)
				if errs := logs.Captured()[watermill.ErrorLogLevel]; len(errs) > 0 {
					t.Fatalf("round %d: a clean shutdown logged %d ERROR entries; the first: %q %v %v",
						round, len(errs), errs[0].Msg, errs[0].Err, errs[0].Fields)
				}
			}
		})
	}
}

// cleanShutdownRound runs one router until records have been handled,
// then shuts it down (its Run context ended when byContext, Close
// otherwise), while records keep coming when busy, and returns what was
// logged.
func cleanShutdownRound(t *testing.T, c *kafkatest.Cluster, byContext, busy bool) *watermill.CaptureLoggerAdapter {
	t.Helper()
	const partitions = 8
	topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
	logs := watermill.NewCaptureLogger()

	sc := c.Secure(safeack.DefaultSaramaSubscriberConfig())
	sc.Version = c.SaramaConfig().Version // the broker's, on a real cluster
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		ConsumerGroup:         group,
		OverwriteSaramaConfig: sc,
	}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	dlq := gochannel.NewGoChannel(gochannel.Config{}, logs)
	t.Cleanup(func() { _ = dlq.Close() })
	poison, err := safeack.PoisonQueue(dlq, "dead-letters")
	require.NoError(t, err)

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logs)
	require.NoError(t, err)
	// Retry logs each failed attempt at ERROR itself, shutdown or not:
	// that is the user's choice of middleware, not what this checks.
	retry := middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond, Logger: watermill.NopLogger{}}
	router.AddMiddleware(poison, retry.Middleware)
	var handled atomic.Int64
	router.AddConsumerHandler("work", topic, sub, func(m *message.Message) error {
		// A dependency (a database pool, a client) is closed by the
		// shutdown: the handler fails once its assignment ends.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-m.Context().Done():
		}
		if safeack.AssignmentEnded(m) {
			return fmt.Errorf("the store is closing: %w", errors.New("connection refused"))
		}
		handled.Add(1)
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- router.Run(ctx) }()
	<-router.Running()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	require.NoError(t, sub.WaitReady(wctx))

	// Records keep arriving until the router has stopped.
	producing := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for {
			select {
			case <-producing:
				return
			default:
			}
			c.ProduceN(t, topic, partitions, partitions*4, nil)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	kafkatest.WaitFor(t, 30*time.Second, "records handled", func() bool { return handled.Load() >= 100 })
	stopProducing := func() {
		close(producing)
		<-produced
	}
	if !busy {
		stopProducing()
		total := int64(len(c.ProducedRecords(topic)))
		kafkatest.WaitFor(t, 30*time.Second, "every record handled", func() bool { return handled.Load() >= total })
	}

	if byContext {
		cancel()
	} else {
		require.NoError(t, router.Close())
	}
	select {
	case err := <-runDone:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the router's Run has not returned a minute after the shutdown began")
	}
	require.NoError(t, sub.Close())
	if busy {
		stopProducing()
	}
	return logs
}
