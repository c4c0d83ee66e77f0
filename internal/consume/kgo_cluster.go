package consume

// The consumer-protocol engine's reads of the cluster, on franz-go: the
// subscription's client (one kgo client without a group, made by connect)
// sends the requests the classic engine sends through Sarama (OffsetFetch,
// ListOffsets, FindCoordinator, DescribeConfigs, Metadata), with the same
// bounds and answers, so that a consumer-protocol subscription opens no
// Sarama client.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/kclient"
)

// kgoReads is clusterReads for a consumer-protocol member. Requests go
// through the subscription's client (cl); a partition's leader and its
// epoch come first from the member's group client (its metadata follows
// the fetches) and from the records fetched (sawEpoch).
type kgoReads struct {
	cl           *kgo.Client
	group, topic string
	// stable sets OffsetFetch's RequireStable: a read_committed member
	// waits for offsets a transaction still holds, as the classic engine
	// does (see kclient.FetchCommittedOnce).
	stable bool
	// retries and backoff are Metadata.Retry's: how often a read is tried
	// again, as Sarama tries its own.
	retries int
	backoff time.Duration
	// timeout bounds one request: Net.DialTimeout plus Net.ReadTimeout,
	// what a Sarama request waits at most.
	timeout time.Duration

	member atomic.Pointer[kgo.Client]
	mu     sync.Mutex
	epochs map[int32]int32
}

var _ clusterReads = (*kgoReads)(nil)

func newKgoReads(cl *kgo.Client, cfg *Options, topic string) *kgoReads {
	sc := cfg.OverwriteSaramaConfig
	return &kgoReads{
		cl: cl, group: cfg.ConsumerGroup, topic: topic,
		stable:  sc.Consumer.IsolationLevel == sarama.ReadCommitted,
		retries: sc.Metadata.Retry.Max, backoff: sc.Metadata.Retry.Backoff,
		timeout: requestBound(sc),
		epochs:  make(map[int32]int32),
	}
}

// requestBound is how long one request may take under conf: the dial and
// the answer.
func requestBound(conf *sarama.Config) time.Duration {
	return conf.Net.DialTimeout + conf.Net.ReadTimeout
}

func (r *kgoReads) Committed(partitions []int32) (map[int32]kclient.CommittedOffset, error) {
	if len(partitions) == 0 {
		return nil, nil
	}
	var lastErr error
	for attempt := 0; attempt <= r.retries; attempt++ {
		out, err := r.CommittedOnce(partitions)
		if err == nil {
			return out, nil
		}
		lastErr = err
		if attempt < r.retries && errors.Is(err, kerr.UnstableOffsetCommit) {
			// A transaction holds the offsets until its markers are
			// written: wait for it. franz-go finds the coordinator again
			// on its own for the other retriable answers.
			time.Sleep(r.backoff)
		}
	}
	return nil, lastErr
}

func (r *kgoReads) CommittedOnce(partitions []int32) (map[int32]kclient.CommittedOffset, error) {
	if len(partitions) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = r.group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = r.topic
	rt.Partitions = partitions
	req.Topics = append(req.Topics, rt)
	req.RequireStable = r.stable
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		return nil, fmt.Errorf("fetching committed offsets: %w", err)
	}
	// franz-go answers a one-group request in both layouts; the group's
	// error is in its entry from OffsetFetch v8 on.
	code, topics := resp.ErrorCode, resp.Topics
	if len(resp.Groups) == 1 {
		code = resp.Groups[0].ErrorCode
	}
	if err := kclient.KafkaError(code); err != nil {
		return nil, fmt.Errorf("fetching committed offsets: %w", err)
	}
	blocks := make(map[int32]kmsg.OffsetFetchResponseTopicPartition, len(partitions))
	for _, t := range topics {
		if t.Topic != r.topic {
			continue
		}
		for _, p := range t.Partitions {
			blocks[p.Partition] = p
		}
	}
	out := make(map[int32]kclient.CommittedOffset, len(partitions))
	for _, p := range partitions {
		block, ok := blocks[p]
		if !ok {
			return nil, fmt.Errorf("fetching committed offsets: no answer for %s/%d", r.topic, p)
		}
		if err := kclient.KafkaError(block.ErrorCode); err != nil {
			return nil, fmt.Errorf("fetching committed offset of %s/%d: %w", r.topic, p, err)
		}
		c := kclient.CommittedOffset{Offset: block.Offset}
		if block.Metadata != nil {
			c.Metadata = *block.Metadata
		}
		out[p] = c
	}
	return out, nil
}

func (r *kgoReads) LogStart(partition int32) (int64, error) {
	offsets, errs := r.ListOffsets([]int32{partition}, sarama.OffsetOldest)
	if err := errs[partition]; err != nil {
		return 0, err
	}
	return offsets[partition], nil
}

func (r *kgoReads) HighWaterMarks(partitions []int32) (map[int32]int64, map[int32]error) {
	return r.listOffsetsOnce(partitions, sarama.OffsetNewest, false)
}

// ListOffsets resolves at (sarama.OffsetNewest or sarama.OffsetOldest) for
// partitions, asking each leader once; the partitions without an answer
// are asked again, with fresh metadata, up to Metadata.Retry.Max times, as
// Sarama's GetOffset asks (kclient.ListOffsets). Those that fail every
// time are left out, with their last error in errs.
func (r *kgoReads) ListOffsets(partitions []int32, at int64) (offsets map[int32]int64, errs map[int32]error) {
	offsets, errs = r.listOffsetsOnce(partitions, at, false)
	for attempt := 0; attempt < r.retries && len(errs) > 0 && !unknownTopic(errs); attempt++ {
		time.Sleep(r.backoff)
		again := make([]int32, 0, len(errs))
		for p := range errs {
			again = append(again, p)
		}
		more, failed := r.listOffsetsOnce(again, at, true)
		for p, off := range more {
			offsets[p] = off
			delete(errs, p)
		}
		for p, err := range failed {
			errs[p] = err
		}
	}
	return offsets, errs
}

// unknownTopic reports whether errs say the topic does not exist or may
// not be read: no retry answers otherwise.
func unknownTopic(errs map[int32]error) bool {
	for _, err := range errs {
		if !errors.Is(err, kerr.UnknownTopicOrPartition) && !errors.Is(err, kerr.TopicAuthorizationFailed) {
			return false
		}
	}
	return true
}

// listOffsetsOnce asks each partition's leader for the offset at, one
// ListOffsets per leader, all at once, and not again: as
// kclient.ListOffsetsOnce does through Sarama. fresh asks the cluster for
// the leaders rather than taking the member's metadata.
func (r *kgoReads) listOffsetsOnce(partitions []int32, at int64, fresh bool) (offsets map[int32]int64, failed map[int32]error) {
	offsets = make(map[int32]int64, len(partitions))
	failed = make(map[int32]error)
	if len(partitions) == 0 {
		return offsets, failed
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	leaders := r.leaders(ctx, partitions, fresh, failed)
	byLeader := make(map[int32][]int32)
	for p, l := range leaders {
		byLeader[l] = append(byLeader[l], p)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for leader, parts := range byLeader {
		wg.Go(func() {
			got, errs := r.listFromLeader(ctx, leader, parts, at)
			mu.Lock()
			defer mu.Unlock()
			for p, off := range got {
				offsets[p] = off
			}
			for p, err := range errs {
				failed[p] = err
			}
		})
	}
	wg.Wait()
	return offsets, failed
}

// errNoLeaderKnown is why a partition the cluster names no leader for is
// not asked.
var errNoLeaderKnown = fmt.Errorf("the cluster names no leader for the partition: %w", kclient.KafkaError(kerr.LeaderNotAvailable.Code))

// leaders returns the leader of each partition: from the member's
// metadata when it knows the partition (and not fresh), else from a
// Metadata request. A partition without one goes to failed, with why.
func (r *kgoReads) leaders(ctx context.Context, partitions []int32, fresh bool, failed map[int32]error) map[int32]int32 {
	out := make(map[int32]int32, len(partitions))
	var ask []int32
	m := r.member.Load()
	for _, p := range partitions {
		if m == nil || fresh {
			ask = append(ask, p)
			continue
		}
		leader, _, err := m.PartitionLeader(r.topic, p)
		switch {
		case err != nil:
			failed[p] = fmt.Errorf("the partition's leader: %w", err)
		case leader < 0:
			ask = append(ask, p) // not in the member's metadata yet
		default:
			out[p] = leader
		}
	}
	if len(ask) == 0 {
		return out
	}
	meta, err := r.topicMetadata(ctx)
	if err != nil {
		for _, p := range ask {
			failed[p] = err
		}
		return out
	}
	known := make(map[int32]kmsg.MetadataResponseTopicPartition, len(meta.Partitions))
	for _, mp := range meta.Partitions {
		known[mp.Partition] = mp
	}
	for _, p := range ask {
		mp, ok := known[p]
		switch {
		case !ok:
			failed[p] = fmt.Errorf("%s has no partition %d: %w", r.topic, p, kclient.KafkaError(kerr.UnknownTopicOrPartition.Code))
		case mp.ErrorCode != 0 && mp.Leader < 0:
			failed[p] = fmt.Errorf("the partition's leader: %w", kclient.KafkaError(mp.ErrorCode))
		case mp.Leader < 0:
			failed[p] = errNoLeaderKnown
		default:
			out[p] = mp.Leader
		}
	}
	return out
}

// topicMetadata asks the cluster for the subscription's topic; an error
// when the topic is unknown or not authorized.
func (r *kgoReads) topicMetadata(ctx context.Context) (kmsg.MetadataResponseTopic, error) {
	return topicMetadata(ctx, r.cl, r.topic, false)
}

// topicMetadata asks the cluster for topic, to be created if autoCreate
// and the cluster creates topics on demand (auto.create.topics.enable).
func topicMetadata(ctx context.Context, cl *kgo.Client, topic string, autoCreate bool) (kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = autoCreate
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return kmsg.MetadataResponseTopic{}, fmt.Errorf("reading the metadata of %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kclient.KafkaError(t.ErrorCode); err != nil {
			return kmsg.MetadataResponseTopic{}, fmt.Errorf("reading the metadata of %s: %w", topic, err)
		}
		return t, nil
	}
	return kmsg.MetadataResponseTopic{}, fmt.Errorf("reading the metadata of %s: no answer for the topic", topic)
}

// listFromLeader sends one ListOffsets for parts to leader, without
// franz-go's retries (they would wait on a leader that does not answer).
func (r *kgoReads) listFromLeader(ctx context.Context, leader int32, parts []int32, at int64) (map[int32]int64, map[int32]error) {
	offsets, failed := make(map[int32]int64, len(parts)), make(map[int32]error)
	fail := func(err error) (map[int32]int64, map[int32]error) {
		for _, p := range parts {
			failed[p] = err
		}
		return offsets, failed
	}
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = r.topic
	for _, p := range parts {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch, rp.MaxNumOffsets = p, at, -1, 1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	// A broker the client does not know yet is looked up first.
	kresp, err := r.cl.Broker(int(leader)).Request(ctx, req)
	if err != nil {
		return fail(fmt.Errorf("listing offsets of %s at broker %d: %w", r.topic, leader, err))
	}
	resp := kresp.(*kmsg.ListOffsetsResponse)
	answered := make(map[int32]bool, len(parts))
	for _, t := range resp.Topics {
		if t.Topic != r.topic {
			continue
		}
		for _, rp := range t.Partitions {
			answered[rp.Partition] = true
			switch err := kclient.KafkaError(rp.ErrorCode); {
			case err != nil:
				failed[rp.Partition] = fmt.Errorf("listing offsets of %s/%d: %w", r.topic, rp.Partition, err)
			case resp.Version == 0 && len(rp.OldStyleOffsets) != 1:
				failed[rp.Partition] = fmt.Errorf("listing offsets of %s/%d: no answer for the partition", r.topic, rp.Partition)
			case resp.Version == 0:
				offsets[rp.Partition] = rp.OldStyleOffsets[0]
			default:
				offsets[rp.Partition] = rp.Offset
			}
		}
	}
	for _, p := range parts {
		if !answered[p] {
			failed[p] = fmt.Errorf("listing offsets of %s/%d: no answer for the partition", r.topic, p)
		}
	}
	return offsets, failed
}

func (r *kgoReads) sawEpoch(p int32, epoch int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if epoch > r.epochs[p] {
		r.epochs[p] = epoch
	}
}

// LeaderEpoch is the newest epoch of the partition's records fetched
// (before they are handed to the claim: franz-go's fetches find a new
// epoch first), or the member's metadata's when newer.
func (r *kgoReads) LeaderEpoch(p int32) (int32, error) {
	r.mu.Lock()
	seen, ok := r.epochs[p]
	r.mu.Unlock()
	e, err := int32(-1), error(nil)
	if m := r.member.Load(); m != nil {
		var leader int32
		leader, e, err = m.PartitionLeader(r.topic, p)
		if err == nil && leader < 0 {
			err = errNoLeaderKnown
		}
	} else {
		err = errors.New("no metadata of the partition yet")
	}
	if err != nil {
		if ok {
			return seen, nil
		}
		return -1, err
	}
	return max(e, seen), nil
}

// kgoCoordinator finds the group's coordinator; its error when the
// cluster refuses to tell (GROUP_AUTHORIZATION_FAILED: no ACL for the
// group).
func kgoCoordinator(ctx context.Context, cl *kgo.Client, group string) (int32, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = group
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return -1, err
	}
	if err := kclient.KafkaError(resp.ErrorCode); err != nil {
		return -1, err
	}
	return resp.NodeID, nil
}

// kgoCoordinatorMetadataLimit reads offset.metadata.max.bytes from the
// group's coordinator (DescribeConfigs of the broker, asked of the broker
// itself), as kclient.CoordinatorMetadataLimit does through Sarama.
func kgoCoordinatorMetadataLimit(ctx context.Context, cl *kgo.Client, group string) (int, error) {
	coord, err := kgoCoordinator(ctx, cl, group)
	if err != nil {
		return 0, fmt.Errorf("finding the group coordinator: %w", err)
	}
	v, err := kclient.DescribeConfig(ctx, cl.Broker(int(coord)), kmsg.ConfigResourceTypeBroker, strconv.Itoa(int(coord)), kclient.BrokerMetadataMaxBytes)
	if err != nil {
		return 0, err
	}
	if v == nil {
		return 0, kclient.ErrNotReported
	}
	n, err := strconv.Atoi(*v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", kclient.BrokerMetadataMaxBytes, *v, err)
	}
	return n, nil
}
