package safeack

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// connect makes a Sarama client for the subscription and checks that it
// reached the cluster, within the time the Sarama config allows
// (Net.DialTimeout, Metadata.Retry, Metadata.Timeout). It returns early,
// with ctx's error or ErrSubscriberClosed, when ctx ends or the Subscriber
// closes first; a client that connects after that is closed.
func (sub *subscription) connect(ctx context.Context) (sarama.Client, error) {
	type result struct {
		client sarama.Client
		err    error
	}
	done := make(chan result, 1)
	go func() {
		cfg := copySaramaConfig(sub.cfg.OverwriteSaramaConfig)
		conns := trackConns(cfg) // closed under the client at the shutdown deadline
		c, err := newConnectedClient(sub.cfg.Brokers, cfg)
		switch {
		case err != nil:
		case sub.cfg.ConsumerGroup != "":
			// Commits must not wait behind a Fetch (see coordinatorClient),
			// nor end with the fetches' connections (see ConsumeClaim).
			cc := newCoordinatorClient(c)
			cc.cfg = copySaramaConfig(sub.cfg.OverwriteSaramaConfig)
			c = &trackedClient{Client: cc, conns: conns, coordConns: trackConns(cc.cfg)}
		default:
			c = &trackedClient{Client: c, conns: conns}
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
	case <-sub.subscriber.closing:
		abandon()
		return nil, ErrSubscriberClosed
	}
}

// newConnectedClient is sarama.NewClient that fails when no broker can be
// reached. NewClient connects only to fetch full metadata; without
// Metadata.Full it is asked for metadata here, with the same tolerance of
// a partly available cluster.
func newConnectedClient(brokers []string, cfg *sarama.Config) (sarama.Client, error) {
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot create Sarama client for brokers %v: %w", brokers, err)
	}
	if !cfg.Metadata.Full {
		if err := client.RefreshMetadata(); err != nil && !partialMetadata(err) {
			_ = client.Close()
			return nil, fmt.Errorf("cannot reach Kafka brokers %v: %w", brokers, err)
		}
	}
	return client, nil
}

// partialMetadata reports errors that sarama.NewClient accepts: the
// cluster answered, but part of it is unavailable or not authorized.
func partialMetadata(err error) bool {
	return errors.Is(err, sarama.ErrLeaderNotAvailable) || errors.Is(err, sarama.ErrReplicaNotAvailable) ||
		errors.Is(err, sarama.ErrTopicAuthorizationFailed) || errors.Is(err, sarama.ErrClusterAuthorizationFailed)
}

// brokerMetadataMaxBytes is the broker setting that bounds commit
// metadata (4096 bytes by default in Apache Kafka).
const brokerMetadataMaxBytes = "offset.metadata.max.bytes"

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
	limit, err := coordinatorMetadataLimit(client, sub.cfg.ConsumerGroup)
	if err != nil {
		sub.logger.Info("Cannot read the broker's "+brokerMetadataMaxBytes+"; TailMetadataBudget is not checked against it",
			sub.logFields.Add(watermill.LogFields{"err": err.Error(), "tail_metadata_budget": sub.cfg.TailMetadataBudget}))
		return nil
	}
	budget := sub.cfg.TailMetadataBudget
	switch {
	case budget <= limit:
	case sub.subscriber.defaultTailBudget:
		sub.workerCfg.TailBudget = limit
		sub.logger.Info("The group coordinator's "+brokerMetadataMaxBytes+" is below the default TailMetadataBudget; the completed tail is kept within it",
			sub.logFields.Add(watermill.LogFields{brokerMetadataMaxBytes: limit, "default_tail_metadata_budget": budget}))
	default:
		return fieldError("TailMetadataBudget", "%d bytes is above the group coordinator's %s (%d): it would reject every commit; lower TailMetadataBudget or raise the broker setting",
			budget, brokerMetadataMaxBytes, limit)
	}
	return nil
}

// errNotReported is returned by describeIntConfig for a broker that
// answers DescribeConfigs without the setting.
var errNotReported = errors.New("not reported by the broker")

// coordinatorMetadataLimit reads offset.metadata.max.bytes from the
// group's coordinator. Broker configs are described by the broker itself.
func coordinatorMetadataLimit(client sarama.Client, group string) (int, error) {
	if tc, ok := client.(*trackedClient); ok {
		client = tc.Client
	}
	if cc, ok := client.(*coordinatorClient); ok {
		// Its coordinator connection carries no broker id; the id is the
		// client's.
		client = cc.Client
	}
	coord, err := client.Coordinator(group)
	if err != nil {
		return 0, fmt.Errorf("finding the group coordinator: %w", err)
	}
	return describeIntConfig(client, sarama.BrokerResource, strconv.Itoa(int(coord.ID())), brokerMetadataMaxBytes)
}

// describeIntConfig reads the integer config name of a broker or topic
// (DescribeConfigs); errNotReported when the answer leaves it out.
func describeIntConfig(client sarama.Client, typ sarama.ConfigResourceType, resource, name string) (int, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, err
	}
	// Not closed: closing this admin would close the caller's client.
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{{
		Type:        typ,
		Name:        resource,
		ConfigNames: []string{name},
	}}, sarama.DescribeConfigsOptions{})
	if err != nil {
		return 0, err
	}
	for _, r := range results {
		if r.ErrorCode != sarama.ErrNoError {
			return 0, &sarama.DescribeConfigError{Err: r.ErrorCode, ErrMsg: r.ErrorMsg}
		}
		for _, e := range r.Configs {
			if e.Name == name {
				n, err := strconv.Atoi(e.Value)
				if err != nil {
					return 0, fmt.Errorf("%s=%q: %w", name, e.Value, err)
				}
				return n, nil
			}
		}
	}
	return 0, errNotReported
}
