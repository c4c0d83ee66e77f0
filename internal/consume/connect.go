package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/sentinel"
)

// conn is one connection of a subscription to the cluster: a Sarama
// client, or for a member of a consumer-protocol group a franz-go client
// (see connectKgo); the zero conn is none.
type conn struct {
	sarama sarama.Client
	kgo    *kgo.Client
	// kgoConf is the Sarama config the franz-go clients of the connection
	// are made from (kclient.KgoOptions): a copy whose dialer is conns,
	// which the shutdown deadline closes under them (see consumeOnce).
	kgoConf *sarama.Config
	conns   *kclient.ConnTracker
}

func (c conn) none() bool { return c.sarama == nil && c.kgo == nil }

// close closes the client; a client closed already is no error.
func (c conn) close() error {
	if c.kgo != nil {
		c.kgo.Close()
	}
	if c.sarama != nil {
		if err := c.sarama.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
			return err
		}
	}
	return nil
}

// partitionCount is how many partitions topic has; 0 when it cannot be
// read (a topic that does not exist yet). As Sarama's metadata requests,
// it has the cluster create the topic when autoCreate
// (Metadata.AllowAutoTopicCreation) and the cluster does so.
func (c conn) partitionCount(ctx context.Context, topic string, autoCreate bool) int32 {
	if c.kgo == nil {
		partitions, err := c.sarama.Partitions(topic)
		if err != nil {
			return 0
		}
		return int32(len(partitions))
	}
	t, err := topicMetadata(ctx, c.kgo, topic, autoCreate)
	if err != nil {
		return 0
	}
	return int32(len(t.Partitions))
}

// connect makes the subscription's client and checks that it reached the
// cluster, within the time the Sarama config allows (Net.DialTimeout,
// Metadata.Retry, Metadata.Timeout): a Sarama client, or for a member of a
// consumer-protocol group a franz-go client (connectKgo). It returns
// early, with ctx's error or sentinel.ErrSubscriberClosed, when ctx ends
// or the Subscriber closes first; a client that connects after that is
// closed.
func (sub *subscription) connect(ctx context.Context) (conn, error) {
	type result struct {
		client conn
		err    error
	}
	done := make(chan result, 1)
	go func() {
		if sub.cfg.ConsumerProtocol && sub.cfg.ConsumerGroup != "" {
			cfg := kclient.CopySaramaConfig(sub.cfg.OverwriteSaramaConfig)
			conns := kclient.TrackConns(cfg)
			c, err := sub.connectKgo(ctx, cfg)
			done <- result{conn{kgo: c, kgoConf: cfg, conns: conns}, err}
			return
		}
		cfg := kclient.CopySaramaConfig(sub.cfg.OverwriteSaramaConfig)
		conns := kclient.TrackConns(cfg) // closed under the client at the shutdown deadline
		c, err := kclient.NewConnectedClient(sub.cfg.Brokers, cfg)
		switch {
		case err != nil:
		case sub.cfg.ConsumerGroup != "":
			// Commits must not wait behind a Fetch (see kclient.CoordinatorClient),
			// nor end with the fetches' connections (see ConsumeClaim).
			cc := kclient.NewCoordinatorClient(c)
			cc.OwnConfig = kclient.CopySaramaConfig(sub.cfg.OverwriteSaramaConfig)
			c = &kclient.TrackedClient{Client: cc, Conns: conns, CoordConns: kclient.TrackConns(cc.OwnConfig)}
		default:
			c = &kclient.TrackedClient{Client: c, Conns: conns}
		}
		done <- result{conn{sarama: c}, err}
	}()
	abandon := func() {
		go func() {
			r := <-done
			_ = r.client.close()
		}()
	}
	select {
	case r := <-done:
		return r.client, r.err
	case <-ctx.Done():
		abandon()
		return conn{}, ctx.Err()
	case <-sub.host.Closing():
		abandon()
		return conn{}, sentinel.ErrSubscriberClosed
	}
}

// connectKgo makes the franz-go client of a consumer-protocol
// subscription: the connection settings of its Sarama config
// (kclient.KgoOptions), Metadata.Retry's retries, and a check that a
// broker answers, tried as Sarama tries its first metadata request. It
// sends the subscription's reads of the cluster (kgoReads), its checks
// and the leader-epoch checks; the group member runs on a client of its
// own (see consumeGroupKgo). sc is the subscription's Sarama config,
// copied, dialing through the connection's tracker.
func (sub *subscription) connectKgo(ctx context.Context, sc *sarama.Config) (*kgo.Client, error) {
	opts, err := kclient.KgoOptions(sc)
	if err != nil {
		return nil, err
	}
	opts = append(opts, kgo.SeedBrokers(sub.cfg.Brokers...),
		kgo.RequestRetries(sc.Metadata.Retry.Max),
		kgo.RetryBackoffFn(func(int) time.Duration { return sc.Metadata.Retry.Backoff }))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot create the consumer-protocol client for brokers %v: %w", sub.cfg.Brokers, err)
	}
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, requestBound(sc))
		err = cl.Ping(pctx)
		cancel()
		if err == nil {
			return cl, nil
		}
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v (Net.DialTimeout + Net.ReadTimeout): %w", requestBound(sc), err)
		}
		if attempt >= sc.Metadata.Retry.Max || ctx.Err() != nil {
			break
		}
		if !backoff.Wait(ctx, sc.Metadata.Retry.Backoff, sub.host.Closing()) {
			break
		}
	}
	cl.Close()
	return nil, fmt.Errorf("cannot reach Kafka brokers %v: %w", sub.cfg.Brokers, err)
}

// checkGroupAccess finds the group's coordinator, and fails when the
// client's principal may not use the group (GROUP_AUTHORIZATION_FAILED: no
// ACL for it). Sarama's consumer group would otherwise retry the join for
// as long as the refusal lasts, and Ready would tell it only after those
// retries (15 s measured on a secured Kafka 4.4.0). Other errors (a
// coordinator still loading or moving) are left to the group's own
// retries.
func (sub *subscription) checkGroupAccess(ctx context.Context, client conn) error {
	if sub.cfg.ConsumerGroup == "" {
		return nil
	}
	var err error
	if client.kgo != nil {
		cctx, cancel := context.WithTimeout(ctx, requestBound(sub.cfg.OverwriteSaramaConfig))
		_, err = kgoCoordinator(cctx, client.kgo, sub.cfg.ConsumerGroup)
		cancel()
	} else {
		_, err = client.sarama.Coordinator(sub.cfg.ConsumerGroup)
	}
	if errors.Is(err, sarama.ErrGroupAuthorizationFailed) {
		return fmt.Errorf("consumer group %q: the client's principal is not authorized to use it (it needs READ on the group): %w",
			sub.cfg.ConsumerGroup, err)
	}
	return nil
}

// checkTailBudget checks TailMetadataBudget against the
// offset.metadata.max.bytes of the group's coordinator, which refuses
// every commit whose metadata is larger: a budget the user set above it is
// an error, the default budget is lowered to it. A coordinator that cannot
// be asked (no DescribeConfigs permission) or does not report the setting
// is not judged: the check is skipped with a log line.
func (sub *subscription) checkTailBudget(ctx context.Context, client conn) error {
	if sub.cfg.ConsumerGroup == "" || sub.cfg.DisableCompletedTail {
		return nil // nothing committed, or no metadata in the commits
	}
	var limit int
	var err error
	if client.kgo != nil {
		cctx, cancel := context.WithTimeout(ctx, 2*requestBound(sub.cfg.OverwriteSaramaConfig))
		limit, err = kgoCoordinatorMetadataLimit(cctx, client.kgo, sub.cfg.ConsumerGroup)
		cancel()
	} else {
		limit, err = kclient.CoordinatorMetadataLimit(client.sarama, sub.cfg.ConsumerGroup)
	}
	if err != nil {
		sub.logger.Info("Cannot read the broker's "+kclient.BrokerMetadataMaxBytes+"; TailMetadataBudget is not checked against it",
			sub.logFields.Add(watermill.LogFields{"err": err.Error(), "tail_metadata_budget": sub.cfg.TailMetadataBudget}))
		return nil
	}
	budget := sub.cfg.TailMetadataBudget
	switch {
	case budget <= limit:
	case sub.cfg.DefaultTailBudget:
		sub.workerCfg.TailBudget = limit
		sub.logger.Info("The group coordinator's "+kclient.BrokerMetadataMaxBytes+" is below the default TailMetadataBudget; the completed tail is kept within it",
			sub.logFields.Add(watermill.LogFields{kclient.BrokerMetadataMaxBytes: limit, "default_tail_metadata_budget": budget}))
	default:
		return sentinel.Field("TailMetadataBudget", "%d bytes is above the group coordinator's %s (%d): it would reject every commit; lower TailMetadataBudget or raise the broker setting",
			budget, kclient.BrokerMetadataMaxBytes, limit)
	}
	return nil
}
