package share

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/sentinel"
)

// CheckGroups is safeack.CheckShareGroups: whether the cluster at brokers
// serves share groups.
func CheckGroups(ctx context.Context, brokers []string, opts ...kgo.Opt) error {
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return err
	}
	defer client.Close()
	return checkSupport(ctx, client)
}

// checkSupport asks a broker which requests it serves and which
// features the cluster has finalized (see CheckGroups).
func checkSupport(ctx context.Context, client *kgo.Client) error {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, client)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	served := make(map[int16]bool, len(resp.ApiKeys))
	for _, k := range resp.ApiKeys {
		served[k.ApiKey] = true
	}
	for _, k := range []kmsg.Key{kmsg.ShareGroupHeartbeat, kmsg.ShareFetch, kmsg.ShareAcknowledge} {
		if !served[int16(k)] {
			return fmt.Errorf("%w: the broker does not serve %s", sentinel.ErrShareGroupsUnsupported, kmsg.NameForKey(int16(k)))
		}
	}
	// A cluster that lists finalized features says whether share groups
	// are on; one that lists none (before KIP-584) has no preview to tell
	// apart.
	if len(resp.FinalizedFeatures) > 0 {
		level := int16(0)
		for _, f := range resp.FinalizedFeatures {
			if f.Name == "share.version" {
				level = f.MaxVersionLevel
			}
		}
		if level < 1 {
			return fmt.Errorf("%w: the cluster's share.version feature is %d (share groups not enabled; generally available from Kafka 4.2)", sentinel.ErrShareGroupsUnsupported, level)
		}
	}
	return nil
}

// setShareAutoOffsetReset sets the group's share.auto.offset.reset.
func setShareAutoOffsetReset(ctx context.Context, client *kgo.Client, group string, initial int64) error {
	value := "latest"
	if initial == sarama.OffsetOldest {
		value = "earliest"
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = "share.auto.offset.reset"
	c.Op = kmsg.IncrementalAlterConfigOpSet
	c.Value = &value
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, client)
	if err != nil {
		return fmt.Errorf("setting share.auto.offset.reset=%s on the group (InitialOffset): %w", value, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = ": " + *r.ErrorMessage
			}
			return fmt.Errorf("setting share.auto.offset.reset=%s on the group (InitialOffset): %w%s", value, err, msg)
		}
	}
	return nil
}

// deadLetterTopicConfig is the group config naming a share group's
// dead-letter topic at the broker (KIP-1191, Kafka 4.4).
const deadLetterTopicConfig = "errors.deadletterqueue.topic.name"

// describeConfig reads one config of one resource (nil: not set, or
// unknown to the broker); what names the resource in errors.
func describeConfig(ctx context.Context, client *kgo.Client, kind kmsg.ConfigResourceType, name, config, what string) (*string, error) {
	v, err := kclient.DescribeConfig(ctx, client, kind, name, config)
	if err != nil {
		return nil, fmt.Errorf("describing %s: %w", what, err)
	}
	return v, nil
}

// groupDeadLetterTopic returns the dead-letter topic group names at the
// broker, "" when it names none (or the broker knows no such config).
func groupDeadLetterTopic(ctx context.Context, client *kgo.Client, group string) (string, error) {
	v, err := describeConfig(ctx, client, kmsg.ConfigResourceTypeGroupConfig, group, deadLetterTopicConfig, "the group's config "+deadLetterTopicConfig)
	if err != nil || v == nil {
		return "", err
	}
	return *v, nil
}

// deadLetterEnableConfig is the topic config that lets share groups
// write to a topic as their dead-letter topic (KIP-1191): without it the
// broker archives a REJECTed record without writing it.
const deadLetterEnableConfig = "errors.deadletterqueue.group.enable"

// checkDeadLetterTopic fails unless topic exists and lets share groups
// write their dead-letter records to it.
func checkDeadLetterTopic(ctx context.Context, client *kgo.Client, topic string) error {
	v, err := describeConfig(ctx, client, kmsg.ConfigResourceTypeTopic, topic, deadLetterEnableConfig, fmt.Sprintf("the dead-letter topic %q", topic))
	if err != nil {
		return err
	}
	if v == nil || *v != "true" {
		return fmt.Errorf("the dead-letter topic %q does not have %s=true: the broker would archive rejected records without writing them", topic, deadLetterEnableConfig)
	}
	return nil
}

// chooseDeadLetter decides where the subscription's records past
// MaxDeliveries go (Options.DeadLetterTarget): brokerDLQ is set when they
// are REJECTed for the group's dead-letter topic at the broker rather
// than passed to DeadLetter.
func (sub *Subscription) chooseDeadLetter(ctx context.Context, admin *kgo.Client) error {
	cfg := sub.cfg
	switch {
	case cfg.DeadLetterTarget == DeadLetterClient:
		return nil
	case cfg.DeadLetterTarget == DeadLetterAuto && cfg.DeadLetter == nil:
		return nil // REJECTed either way
	}
	topic, err := groupDeadLetterTopic(ctx, admin, cfg.ShareGroup)
	if err == nil && topic != "" {
		err = checkDeadLetterTopic(ctx, admin, topic)
	}
	switch {
	case cfg.DeadLetterTarget == DeadLetterBroker && topic == "" && err == nil:
		return fmt.Errorf("%w: DeadLetterTarget is ShareDeadLetterBroker, but share group %q names no dead-letter topic "+
			"(group config %s, Kafka 4.4+ with share.version 2)", sentinel.ErrInvalidConfig, cfg.ShareGroup, deadLetterTopicConfig)
	case cfg.DeadLetterTarget == DeadLetterBroker && err != nil:
		return fmt.Errorf("%w: DeadLetterTarget is ShareDeadLetterBroker: %w", sentinel.ErrInvalidConfig, err)
	case err != nil:
		sub.logger.Error("The share group's dead-letter topic at the broker cannot be used; records past MaxDeliveries go to DeadLetter", err, nil)
		return nil
	}
	sub.brokerDLQ = topic
	if topic != "" {
		sub.logger.Info("Records past MaxDeliveries are rejected for the share group's dead-letter topic at the broker; DeadLetter is not called",
			watermill.LogFields{"dead_letter_topic": topic})
	}
	return nil
}
