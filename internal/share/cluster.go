package share

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
