package consume

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/sentinel"
)

// connect makes a Sarama client for the subscription and checks that it
// reached the cluster, within the time the Sarama config allows
// (Net.DialTimeout, Metadata.Retry, Metadata.Timeout). It returns early,
// with ctx's error or sentinel.ErrSubscriberClosed, when ctx ends or the Subscriber
// closes first; a client that connects after that is closed.
func (sub *subscription) connect(ctx context.Context) (sarama.Client, error) {
	type result struct {
		client sarama.Client
		err    error
	}
	done := make(chan result, 1)
	go func() {
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
		done <- result{c, err}
	}()
	abandon := func() {
		go func() {
			if r := <-done; r.client != nil {
				_ = r.client.Close()
			}
		}()
	}
	select {
	case r := <-done:
		return r.client, r.err
	case <-ctx.Done():
		abandon()
		return nil, ctx.Err()
	case <-sub.host.Closing():
		abandon()
		return nil, sentinel.ErrSubscriberClosed
	}
}

// checkGroupAccess finds the group's coordinator, and fails when the
// client's principal may not use the group (GROUP_AUTHORIZATION_FAILED: no
// ACL for it). Sarama's consumer group would otherwise retry the join for
// as long as the refusal lasts, and Ready would tell it only after those
// retries (15 s measured on a secured Kafka 4.4.0). Other errors (a
// coordinator still loading or moving) are left to the group's own
// retries.
func (sub *subscription) checkGroupAccess(client sarama.Client) error {
	if sub.cfg.ConsumerGroup == "" {
		return nil
	}
	if _, err := client.Coordinator(sub.cfg.ConsumerGroup); errors.Is(err, sarama.ErrGroupAuthorizationFailed) {
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
func (sub *subscription) checkTailBudget(client sarama.Client) error {
	if sub.cfg.ConsumerGroup == "" || sub.cfg.DisableCompletedTail {
		return nil // nothing committed, or no metadata in the commits
	}
	limit, err := kclient.CoordinatorMetadataLimit(client, sub.cfg.ConsumerGroup)
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
