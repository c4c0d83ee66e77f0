package safeack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// SubscribeInitialize creates topic with InitializeTopicDetails and, unless
// DoNotWaitForTopicCreation, waits until all its partitions have leaders.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	return s.SubscribeInitializeWithContext(context.Background(), topic)
}

// SubscribeInitializeWithContext is SubscribeInitialize bounded by ctx.
func (s *Subscriber) SubscribeInitializeWithContext(ctx context.Context, topic string) (err error) {
	if s.cfg.InitializeTopicDetails == nil {
		return errors.New("safeack: InitializeTopicDetails is empty, cannot SubscribeInitialize")
	}
	admin, err := sarama.NewClusterAdmin(s.cfg.Brokers, s.cfg.OverwriteSaramaConfig)
	if err != nil {
		return fmt.Errorf("cannot create cluster admin: %w", err)
	}
	defer func() { err = errors.Join(err, admin.Close()) }()

	if err := admin.CreateTopic(topic, s.cfg.InitializeTopicDetails, false); err != nil &&
		!errors.Is(err, sarama.ErrTopicAlreadyExists) && !strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("cannot create topic %q: %w", topic, err)
	}
	if s.cfg.DoNotWaitForTopicCreation {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WaitForTopicCreationTimeout)
	defer cancel()
	return waitForTopic(ctx, admin, topic, s.cfg.InitializeTopicDetails.NumPartitions)
}

func waitForTopic(ctx context.Context, admin sarama.ClusterAdmin, topic string, partitions int32) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		md, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError && topicReady(md[0], partitions) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %q not ready: %w", topic, ctx.Err())
		case <-tick.C:
		}
	}
}

func topicReady(md *sarama.TopicMetadata, want int32) bool {
	if want > 0 && int32(len(md.Partitions)) < want {
		return false
	}
	if len(md.Partitions) == 0 {
		return false
	}
	for _, p := range md.Partitions {
		if p.Err != sarama.ErrNoError || p.Leader < 0 {
			return false
		}
	}
	return true
}
