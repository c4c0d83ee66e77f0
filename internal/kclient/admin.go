package kclient

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
)

// NewConnectedClient is sarama.NewClient that fails when no broker can be
// reached. NewClient connects only to fetch full metadata; without
// Metadata.Full it is asked for metadata here, with the same tolerance of
// a partly available cluster.
func NewConnectedClient(brokers []string, cfg *sarama.Config) (sarama.Client, error) {
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot create Sarama client for brokers %v: %w", brokers, err)
	}
	if !cfg.Metadata.Full {
		if err := client.RefreshMetadata(); err != nil && !PartialMetadata(err) {
			_ = client.Close()
			return nil, fmt.Errorf("cannot reach Kafka brokers %v: %w", brokers, err)
		}
	}
	return client, nil
}

// PartialMetadata reports errors that sarama.NewClient accepts: the
// cluster answered, but part of it is unavailable or not authorized.
func PartialMetadata(err error) bool {
	return errors.Is(err, sarama.ErrLeaderNotAvailable) || errors.Is(err, sarama.ErrReplicaNotAvailable) ||
		errors.Is(err, sarama.ErrTopicAuthorizationFailed) || errors.Is(err, sarama.ErrClusterAuthorizationFailed)
}

// BrokerMetadataMaxBytes is the broker setting that bounds commit
// metadata (4096 bytes by default in Apache Kafka).
const BrokerMetadataMaxBytes = "offset.metadata.max.bytes"

// ErrNotReported is returned by DescribeIntConfig for a broker that
// answers DescribeConfigs without the setting.
var ErrNotReported = errors.New("not reported by the broker")

// CoordinatorMetadataLimit reads offset.metadata.max.bytes from the
// group's coordinator. Broker configs are described by the broker itself.
func CoordinatorMetadataLimit(client sarama.Client, group string) (int, error) {
	if tc, ok := client.(*TrackedClient); ok {
		client = tc.Client
	}
	if cc, ok := client.(*CoordinatorClient); ok {
		// Its coordinator connection carries no broker id; the id is the
		// client's.
		client = cc.Client
	}
	coord, err := client.Coordinator(group)
	if err != nil {
		return 0, fmt.Errorf("finding the group coordinator: %w", err)
	}
	return DescribeIntConfig(client, sarama.BrokerResource, strconv.Itoa(int(coord.ID())), BrokerMetadataMaxBytes)
}

// DescribeIntConfig reads the integer config name of a broker or topic
// (DescribeConfigs); ErrNotReported when the answer leaves it out.
func DescribeIntConfig(client sarama.Client, typ sarama.ConfigResourceType, resource, name string) (int, error) {
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
	return 0, ErrNotReported
}
