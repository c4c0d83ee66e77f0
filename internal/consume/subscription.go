package consume

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
)

// subscription is one Subscribe call: one output channel, one in-flight
// budget, one consumer (group) connection at a time.
type subscription struct {
	host   Host
	cfg    *Options
	logger watermill.LoggerAdapter
	topic  string
	output chan *message.Message
	// pool is the output and the MaxInFlight tokens the subscription's
	// partition workers share; workerCfg is their configuration.
	pool      *partition.Pool
	workerCfg partition.Config
	logFields watermill.LogFields
	// txn is where completed offsets go in transactional mode (with the
	// outputs of acked deliveries); nil: the group session's marks.
	txn *txnCommitter
	// commits tells the host of every commit; nil when it does not ask.
	commits *commitReports
	// resume is, without a consumer group, where each partition's
	// completed prefix ended when a connection ended: the next connection
	// starts there (see consumePartitions).
	resume resumePositions
	// firstPartitions is how many partitions the topic had when Subscribe
	// connected (0: unknown). Partitions numbered from it on were added
	// later, so every record in them was written after Subscribe: they
	// start at their first record whatever Offsets.Initial says (see
	// initialOffset).
	firstPartitions int32
	// halt bounds the subscription's end, whatever the brokers do (see
	// shutdown).
	halt *shutdown
	// leaders follows whether the running partitions' leaders answer
	// (see leaderLoss).
	leaders *leaderLoss
}

// newWorker returns the worker of one assigned partition. Its context,
// and its messages' contexts, derive from parent.
func (sub *subscription) newWorker(parent context.Context, a partition.Assignment) (*partition.Worker, error) {
	return partition.New(parent, &sub.workerCfg, sub.pool, a)
}

// run consumes until ctx ends or the Subscriber closes, reconnecting after
// errors as watermill-kafka does. client is the first connection, made by
// Subscribe.
func (sub *subscription) run(ctx context.Context, client conn) {
	for {
		if client.none() {
			c, err := sub.connect(ctx)
			if err != nil {
				if sub.stopping(ctx) {
					return
				}
				sub.logger.Error("Cannot connect to Kafka; retrying", err, sub.logFields)
				sub.setPhase(ready.Connecting, err)
				if !sub.pause(ctx) {
					return
				}
				continue
			}
			client = c
		}
		if sub.cfg.ConsumerGroup == "" {
			sub.setPhase(ready.Consuming, nil)
		} else {
			sub.setPhase(ready.Joining, nil)
		}
		err := sub.consumeOnce(ctx, client)
		client = conn{}
		if errors.Is(err, sentinel.ErrInstanceFenced) {
			return // logged and reported by fenced; a reconnect would rejoin
		}
		if sub.stopping(ctx) {
			return
		}
		if err != nil {
			sub.logger.Error("Consumer stopped; reconnecting", err, sub.logFields)
		} else {
			sub.logger.Info("Consumer stopped; reconnecting", sub.logFields)
		}
		sub.setPhase(ready.Connecting, err)
		if !sub.pause(ctx) {
			return
		}
	}
}

// pause waits ReconnectRetrySleep before a reconnect. It reports false
// when ctx ended or the Subscriber closed meanwhile.
func (sub *subscription) pause(ctx context.Context) bool {
	return backoff.Wait(ctx, sub.cfg.retrySleep(), sub.host.Closing())
}

func (sub *subscription) stopping(ctx context.Context) bool {
	select {
	case <-sub.host.Closing():
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// consumeOnce runs one client connection until it fails or is stopped,
// and closes the client.
func (sub *subscription) consumeOnce(parent context.Context, client conn) error {
	var closeOnce sync.Once
	closeClient := func() {
		closeOnce.Do(func() {
			if err := client.close(); err != nil {
				sub.logger.Error("Cannot close Sarama client", err, sub.logFields)
			}
		})
	}
	ended := make(chan struct{})
	defer func() {
		close(ended)
		if sub.halt.isAbandoned() {
			// Its Close may wait for a broker that does not answer.
			go closeClient()
			return
		}
		closeClient()
	}()
	// At the shutdown deadline, the requests still waiting for a broker
	// fail at once and no new one is sent: the consumer group's last
	// steps (its final commit, leaving the group) end without waiting out
	// Net.ReadTimeout.
	go func() {
		select {
		case <-sub.halt.abandoned:
			if tc, ok := client.sarama.(*kclient.TrackedClient); ok {
				tc.Abandon()
			}
			if client.conns != nil {
				client.conns.Abandon() // the franz-go clients' connections
			}
			go closeClient()
		case <-ended:
		}
	}()

	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-sub.host.Closing():
			cancel()
		case <-ctx.Done():
		}
	}()

	if client.kgo != nil {
		return sub.consumeGroupKgo(ctx, client)
	}
	if sub.cfg.ConsumerGroup == "" {
		return sub.consumePartitions(ctx, client.sarama)
	}
	return sub.consumeGroup(ctx, client.sarama)
}

// setPhase reports where the subscription stands, for Ready.
func (sub *subscription) setPhase(p ready.Phase, err error) {
	sub.host.SetPhase(sub, sub.topic, p, err)
}
