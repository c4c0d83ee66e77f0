package safeack

import (
	"fmt"

	"github.com/IBM/sarama"
)

// committedOffset is what the group coordinator holds for one partition.
type committedOffset struct {
	offset   int64 // -1: nothing committed
	metadata string
}

// fetchCommitted reads the group's committed offsets and metadata for the
// given partitions of topic with one OffsetFetch request. A Sarama session
// offers no way to read commit metadata back, hence the request of our own.
func fetchCommitted(client sarama.Client, group, topic string, partitions []int32) (map[int32]committedOffset, error) {
	if len(partitions) == 0 {
		return nil, nil
	}
	conf := client.Config()
	var lastErr error
	for attempt := 0; attempt <= conf.Metadata.Retry.Max; attempt++ {
		out, err := fetchCommittedOnce(client, group, topic, partitions)
		if err == nil {
			return out, nil
		}
		lastErr = err
		if rerr := client.RefreshCoordinator(group); rerr != nil {
			lastErr = fmt.Errorf("%w (refreshing coordinator: %v)", err, rerr)
		}
	}
	return nil, lastErr
}

func fetchCommittedOnce(client sarama.Client, group, topic string, partitions []int32) (map[int32]committedOffset, error) {
	coordinator, err := client.Coordinator(group)
	if err != nil {
		return nil, fmt.Errorf("finding the coordinator of group %q: %w", group, err)
	}
	req := sarama.NewOffsetFetchRequest(client.Config().Version, group, map[string][]int32{topic: partitions})
	resp, err := coordinator.FetchOffset(req)
	if err != nil {
		return nil, fmt.Errorf("fetching committed offsets: %w", err)
	}
	if resp.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("fetching committed offsets: %w", resp.Err)
	}
	out := make(map[int32]committedOffset, len(partitions))
	for _, p := range partitions {
		block := resp.GetBlock(topic, p)
		if block == nil {
			return nil, fmt.Errorf("fetching committed offsets: no answer for %s/%d", topic, p)
		}
		if block.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("fetching committed offset of %s/%d: %w", topic, p, block.Err)
		}
		out[p] = committedOffset{offset: block.Offset, metadata: block.Metadata}
	}
	return out, nil
}
