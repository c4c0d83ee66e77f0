package consume

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
)

// Subscription is one Subscribe call, started: Run consumes until its
// context ends or the host closes, then closes Output.
type Subscription struct {
	sub    *subscription
	client conn // the first connection, made by Start
}

// Start begins a subscription to topic for host: it makes the first
// connection (so that a cluster that cannot be reached is an error, not a
// silent retry loop), checks the tail budget against the group
// coordinator, and finds where the partitions start. txn, when not nil,
// makes it commit through Kafka transactions. Errors other than
// sentinel.ErrInvalidConfig's are wrapped with the topic.
func Start(ctx context.Context, opts *Options, host Host, topic string, txn *Txn) (*Subscription, error) {
	output := make(chan *message.Message)
	sub := &subscription{
		host:   host,
		cfg:    opts,
		logger: opts.Logger,
		topic:  topic,
		output: output,
		pool:   partition.NewPool(output, opts.MaxInFlight),
		halt:   newShutdown(),
		logFields: watermill.LogFields{
			"provider":            "safeack",
			"topic":               topic,
			"consumer_group":      opts.ConsumerGroup,
			"kafka_consumer_uuid": watermill.NewShortUUID(),
		},
	}
	sub.leaders = newLeaderLoss(sub)
	sub.workerCfg = opts.Worker
	sub.workerCfg.Seed = maphash.MakeSeed()
	sub.workerCfg.LogFields = sub.logFields
	if opts.ReportCommits {
		sub.commits = &commitReports{host: host, topic: topic, group: opts.ConsumerGroup}
	}
	sub.logger.Info("Subscribing to Kafka topic", sub.logFields)
	if txn != nil {
		if err := sub.startTxn(txn); err != nil {
			return nil, err
		}
	}

	client, err := sub.connect(ctx)
	if err == nil {
		err = sub.checkGroupAccess(ctx, client)
	}
	if err == nil {
		err = sub.checkConsumerProtocol(ctx, client)
	}
	if err == nil {
		err = sub.checkTailBudget(ctx, client)
	}
	if err == nil {
		if opts.ConsumerGroup == "" {
			sub.resolveFirstStarts(client.sarama)
		} else {
			sub.firstPartitions = client.partitionCount(ctx, topic, opts.OverwriteSaramaConfig.Metadata.AllowAutoTopicCreation) // see initialOffset
		}
	}
	s := &Subscription{sub: sub, client: client}
	if err != nil {
		s.Abort()
		if errors.Is(err, sentinel.ErrSubscriberClosed) || errors.Is(err, sentinel.ErrInvalidConfig) {
			return nil, err
		}
		return nil, fmt.Errorf("safeack: subscribing to %q: %w", topic, err)
	}
	return s, nil
}

// Output is the channel the subscription's messages arrive on.
func (s *Subscription) Output() <-chan *message.Message { return s.sub.output }

// Abort gives up a started subscription that will not run.
func (s *Subscription) Abort() {
	s.client.close()
	if s.sub.txn != nil {
		s.sub.txn.close()
	}
}

// Run reports the subscription joining (without a consumer group,
// consuming) and returns; its consumer runs in a goroutine until ctx ends
// or the host closes. left is called once its group member has left, before
// the output closes (a reader that sees the channel closed may subscribe
// again at once, as the same static member), and done once the output is
// closed.
func (s *Subscription) Run(ctx context.Context, left, done func()) {
	sub := s.sub
	if sub.cfg.ConsumerGroup == "" {
		sub.setPhase(ready.Consuming, nil)
	} else {
		sub.setPhase(ready.Joining, nil)
	}
	go func() {
		defer done()
		ended := make(chan struct{})
		defer close(ended)
		go func() {
			select {
			case <-sub.host.Closing():
			case <-ctx.Done():
			case <-ended:
				return
			}
			sub.halt.stop(sub.cfg.CloseBudget())
		}()
		sub.run(ctx, s.client)
		if sub.txn != nil {
			sub.txn.close()
		}
		sub.host.Ended(sub)
		left()
		close(sub.output)
	}()
}
