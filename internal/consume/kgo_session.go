package consume

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kgoSession is the groupSession of a consumer-protocol member: its marks,
// and safeack's own OffsetCommit (kgo's commits would overwrite the
// completed tail in the metadata), sent with the member's id and epoch as
// kgo last heard them (GroupMetadata), for the partitions the member owns
// only. A partition stops being owned before its revocation is
// acknowledged (after its final commit) or as soon as it is lost.
type kgoSession struct {
	ctx        context.Context
	cl         *kgo.Client
	group      string
	topic      string
	instanceID string
	logger     watermill.LoggerAdapter
	logFields  watermill.LogFields
	// fenced, when not nil, is told of a commit refused with
	// FENCED_INSTANCE_ID (see kgoGroup.fence).
	fenced func()
	// abandoned closes at the shutdown's deadline: a request still
	// waiting for a broker then fails at once, and no new one is sent,
	// as the classic engine's client does (kclient.TrackedClient.Abandon).
	abandoned <-chan struct{}

	// commitMu orders the commits: a later mark never lands before an
	// earlier one.
	commitMu sync.Mutex

	mu    sync.Mutex
	owned map[int32]bool
	// marks is the last position marked per partition; sent the last one
	// the coordinator took.
	marks, sent map[int32]kgoMark
	topicID     [16]byte
}

type kgoMark struct {
	offset   int64
	metadata string
}

var _ groupSession = (*kgoSession)(nil)

func newKgoSession(ctx context.Context, cl *kgo.Client, group, topic, instanceID string, abandoned <-chan struct{},
	logger watermill.LoggerAdapter, fields watermill.LogFields,
) *kgoSession {
	return &kgoSession{
		ctx: ctx, cl: cl, group: group, topic: topic, instanceID: instanceID, abandoned: abandoned, logger: logger, logFields: fields,
		owned: make(map[int32]bool), marks: make(map[int32]kgoMark), sent: make(map[int32]kgoMark),
	}
}

func (s *kgoSession) Context() context.Context { return s.ctx }

func (s *kgoSession) Claims() map[string][]int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := make([]int32, 0, len(s.owned))
	for p := range s.owned {
		parts = append(parts, p)
	}
	return map[string][]int32{s.topic: parts}
}

func (s *kgoSession) MemberID() string {
	id, _ := s.cl.GroupMetadata()
	return id
}

func (s *kgoSession) GenerationID() int32 {
	_, epoch := s.cl.GroupMetadata()
	return epoch
}

// own adds partitions the coordinator assigned; their marks start afresh.
func (s *kgoSession) own(parts []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range parts {
		s.owned[p] = true
		delete(s.marks, p)
		delete(s.sent, p)
	}
}

// disown drops partitions revoked (after their final commit) or lost:
// nothing more is committed for them.
func (s *kgoSession) disown(parts []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range parts {
		delete(s.owned, p)
		delete(s.marks, p)
		delete(s.sent, p)
	}
}

func (s *kgoSession) disownAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.owned)
	clear(s.marks)
	clear(s.sent)
}

func (s *kgoSession) MarkOffset(topic string, p int32, offset int64, metadata string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if topic != s.topic || !s.owned[p] {
		return
	}
	if m, ok := s.marks[p]; ok && offset < m.offset {
		return
	}
	s.marks[p] = kgoMark{offset, metadata}
}

func (s *kgoSession) ResetOffset(topic string, p int32, offset int64, metadata string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if topic != s.topic || !s.owned[p] {
		return
	}
	s.marks[p] = kgoMark{offset, metadata}
}

// commitAttempts bounds the OffsetCommits one Commit sends when the
// coordinator refuses the member's epoch (it moved on meanwhile: kgo's
// next heartbeat brings the new one).
const commitAttempts = 5

// Commit sends the marks the coordinator does not hold yet, of the
// partitions the member owns. A refused epoch (STALE_MEMBER_EPOCH,
// FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) is retried with the epoch kgo
// holds then, for the partitions still owned; what is still not held stays
// to send with the next Commit.
func (s *kgoSession) Commit() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	wait := 20 * time.Millisecond
	for attempt := 0; attempt < commitAttempts; attempt++ {
		retry, err := s.commitOnce()
		if err != nil {
			s.logger.Debug("OffsetCommit failed", s.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
		if !retry {
			return
		}
		select { // kgo's heartbeat brings the new epoch meanwhile
		case <-time.After(wait):
		case <-s.abandoned:
			return
		}
		wait *= 2
	}
}

// commitOnce sends one OffsetCommit. retry: the coordinator refused the
// member's epoch for some partition.
func (s *kgoSession) commitOnce() (retry bool, err error) {
	s.mu.Lock()
	pending := make(map[int32]kgoMark)
	for p, m := range s.marks {
		if sent, ok := s.sent[p]; s.owned[p] && (!ok || sent != m) {
			pending[p] = m
		}
	}
	s.mu.Unlock()
	if len(pending) == 0 {
		return false, nil
	}
	select {
	case <-s.abandoned:
		return false, errShutdownAbandoned
	default:
	}
	id, err := s.loadTopicID()
	if err != nil {
		return false, err
	}
	member, epoch := s.cl.GroupMetadata()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = s.group
	req.MemberID = member
	req.Generation = epoch
	if s.instanceID != "" {
		req.InstanceID = &s.instanceID
	}
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = s.topic
	rt.TopicID = id
	for p, m := range pending {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition = p
		rp.Offset = m.offset
		rp.LeaderEpoch = -1
		meta := m.metadata
		rp.Metadata = &meta
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := s.requestContext()
	defer cancel()
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			m, ok := pending[rp.Partition]
			if !ok {
				continue
			}
			switch perr := kerr.ErrorForCode(rp.ErrorCode); {
			case perr == nil:
				if s.owned[rp.Partition] {
					s.sent[rp.Partition] = m
				}
			case errors.Is(perr, kerr.FencedInstanceID):
				if s.fenced != nil {
					s.fenced()
				}
				err = perr
			case errors.Is(perr, kerr.StaleMemberEpoch), errors.Is(perr, kerr.FencedMemberEpoch),
				errors.Is(perr, kerr.UnknownMemberID), errors.Is(perr, kerr.IllegalGeneration):
				retry = retry || s.owned[rp.Partition]
				err = perr
			default:
				err = perr
			}
		}
	}
	return retry, err
}

// errShutdownAbandoned: the shutdown's deadline passed; no request is sent.
var errShutdownAbandoned = errors.New("safeack: the subscription's shutdown deadline passed; nothing more is sent")

// requestContext bounds one of the session's requests: 10 s, or until the
// shutdown's deadline passed (see abandoned).
func (s *kgoSession) requestContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if s.abandoned == nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-s.abandoned:
			cancel()
		case <-done:
		}
	}()
	return ctx, func() { close(done); cancel() }
}

// loadTopicID reads the topic's id once: OffsetCommit v10 names topics by
// id.
func (s *kgoSession) loadTopicID() ([16]byte, error) {
	s.mu.Lock()
	id := s.topicID
	s.mu.Unlock()
	if id != ([16]byte{}) {
		return id, nil
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(s.topic)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := s.requestContext()
	defer cancel()
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return id, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == s.topic {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
				return id, err
			}
			id = t.TopicID
		}
	}
	s.mu.Lock()
	s.topicID = id
	s.mu.Unlock()
	return id, nil
}
