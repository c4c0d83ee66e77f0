package kclient

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/backoff"
)

// CommittedOffset is what the group coordinator holds for one partition.
type CommittedOffset struct {
	Offset   int64 // -1: nothing committed
	Metadata string
}

// holds reports whether c, what the coordinator holds, is want or a later
// position. At an equal offset the completed tail must match: a tail that
// grew behind an unchanged head is a new position, and the next owner
// skips what it lists. Metadata without a tail (the leader epoch alone, or
// "") differs from "" in nothing the next owner skips: a claim that marked
// nothing past the commit it started from wants "" (its worker marked no
// metadata), while the coordinator keeps the earlier owner's epoch-only
// metadata, which Sarama never sends again for an unmarked partition.
func (c CommittedOffset) Holds(want CommittedOffset) bool {
	if c.Offset != want.Offset {
		return c.Offset > want.Offset
	}
	if c.Metadata == want.Metadata {
		return true
	}
	return want.Metadata == "" && !HasTail(c)
}

// HasTail reports whether c's metadata lists completed records above its
// offset; metadata that does not decode lists none the next owner trusts.
func HasTail(c CommittedOffset) bool {
	t, err := frontier.DecodeTail(c.Metadata, max(c.Offset, 0))
	return err == nil && len(t.Ranges) > 0
}

// FetchCommitted reads the group's committed offsets and metadata for the
// given partitions of topic with one OffsetFetch request. A Sarama session
// offers no way to read commit metadata back, hence the request of our own.
func FetchCommitted(client sarama.Client, group, topic string, partitions []int32) (map[int32]CommittedOffset, error) {
	if len(partitions) == 0 {
		return nil, nil
	}
	conf := client.Config()
	var lastErr error
	var pace backoff.Doubling
	for attempt := 0; attempt <= conf.Metadata.Retry.Max; attempt++ {
		out, err := FetchCommittedOnce(client, group, topic, partitions)
		if err == nil {
			return out, nil
		}
		lastErr = err
		if errors.Is(err, sarama.ErrUnstableOffsetCommit) {
			// A transaction holds the offsets until its markers are
			// written: wait for it rather than for the coordinator.
			if attempt < conf.Metadata.Retry.Max {
				time.Sleep(pace.Next())
			}
			continue
		}
		if rerr := client.RefreshCoordinator(group); rerr != nil {
			lastErr = fmt.Errorf("%w (refreshing coordinator: %v)", err, rerr)
		}
	}
	return nil, lastErr
}

func FetchCommittedOnce(client sarama.Client, group, topic string, partitions []int32) (map[int32]CommittedOffset, error) {
	coordinator, err := client.Coordinator(group)
	if err != nil {
		return nil, fmt.Errorf("finding the coordinator of group %q: %w", group, err)
	}
	req := sarama.NewOffsetFetchRequest(client.Config().Version, group, map[string][]int32{topic: partitions})
	// As Sarama's offset manager: a read_committed consumer (transactional
	// mode) waits for offsets a transaction still holds (KIP-447) rather
	// than reading the commit before them. Sarama starts the claim at the
	// stable offset; at an unchanged offset the older commit's completed
	// tail can list fewer records than the newer one, and the records
	// between would be handled, and their outputs written, again.
	req.RequireStable = client.Config().Consumer.IsolationLevel == sarama.ReadCommitted && req.Version >= 7
	resp, err := coordinator.FetchOffset(req)
	if err != nil {
		return nil, fmt.Errorf("fetching committed offsets: %w", err)
	}
	if resp.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("fetching committed offsets: %w", resp.Err)
	}
	out := make(map[int32]CommittedOffset, len(partitions))
	for _, p := range partitions {
		block := resp.GetBlock(topic, p)
		if block == nil {
			return nil, fmt.Errorf("fetching committed offsets: no answer for %s/%d", topic, p)
		}
		if block.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("fetching committed offset of %s/%d: %w", topic, p, block.Err)
		}
		out[p] = CommittedOffset{Offset: block.Offset, Metadata: block.Metadata}
	}
	return out, nil
}

// ListOffsets resolves at (sarama.OffsetNewest or sarama.OffsetOldest) for
// partitions of topic with one ListOffsets request per partition leader,
// the leaders asked at once: what client.GetOffset, one partition and one
// round trip at a time, would answer. A partition without an answer here
// (its leader unknown, a failed request, an error in its block) is asked
// again through client.GetOffset, which refreshes the metadata first; one
// that fails there too is left out of the result, with its error in errs.
func ListOffsets(client sarama.Client, topic string, partitions []int32, at int64) (offsets map[int32]int64, errs map[int32]error) {
	offsets, failed := ListOffsetsOnce(client, topic, partitions, at)
	errs = make(map[int32]error)
	for p := range failed {
		off, err := client.GetOffset(topic, p, at)
		if err != nil {
			errs[p] = err
			continue
		}
		offsets[p] = off
	}
	return offsets, errs
}

// ListOffsetsOnce is ListOffsets without the second try: the partitions
// without an answer are returned in failed, each with why.
func ListOffsetsOnce(client sarama.Client, topic string, partitions []int32, at int64) (offsets map[int32]int64, failed map[int32]error) {
	offsets = make(map[int32]int64, len(partitions))
	failed = make(map[int32]error)
	byLeader := make(map[*sarama.Broker][]int32)
	for _, p := range partitions {
		leader, err := client.Leader(topic, p)
		if err != nil {
			failed[p] = err
			continue
		}
		byLeader[leader] = append(byLeader[leader], p)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for leader, parts := range byLeader {
		wg.Go(func() {
			req := sarama.NewOffsetRequest(client.Config().Version)
			for _, p := range parts {
				req.AddBlock(topic, p, at, 1)
			}
			resp, err := leader.GetAvailableOffsets(req)
			mu.Lock()
			defer mu.Unlock()
			for _, p := range parts {
				var block *sarama.OffsetResponseBlock
				if err == nil {
					block = resp.GetBlock(topic, p)
				}
				switch {
				case err != nil:
					failed[p] = err
				case block == nil || block.Err == sarama.ErrNoError && len(block.Offsets) != 1:
					failed[p] = fmt.Errorf("listing offsets of %s/%d: no answer for the partition", topic, p)
				case block.Err != sarama.ErrNoError:
					failed[p] = block.Err
				default:
					offsets[p] = block.Offsets[0]
				}
			}
		})
	}
	wg.Wait()
	return offsets, failed
}
