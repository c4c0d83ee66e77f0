package kclient

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeConfig reads one config of one resource through r (a client, or
// one of its brokers where the config is the broker's own): nil when it is
// not set or the broker does not know it. A refusal is a KafkaError, with
// the broker's message when it gave one.
func DescribeConfig(ctx context.Context, r kmsg.Requestor, kind kmsg.ConfigResourceType, name, config string) (*string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kind
	res.ResourceName = name
	res.ConfigNames = []string{config}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, r)
	if err != nil {
		return nil, err
	}
	for _, r := range resp.Resources {
		if err := KafkaError(r.ErrorCode); err != nil {
			if r.ErrorMessage != nil {
				return nil, fmt.Errorf("%w: %s", err, *r.ErrorMessage)
			}
			return nil, err
		}
		for _, c := range r.Configs {
			if c.Name == config && c.Value != nil {
				return c.Value, nil
			}
		}
	}
	return nil, nil
}
