package kafkatest

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Answer makes the embedded broker answer every request of kind key for
// which answer returns a response and true (the others go on to the
// broker), for the rest of the test; answer is told how many it answered
// before. Answer returns that count. The
// answer function runs on kfake's request goroutine: it must not block.
// Embedded broker only (see RequireEmbedded).
func (c *Cluster) Answer(key kmsg.Key, answer func(req kmsg.Request, answered int32) (kmsg.Response, bool)) *atomic.Int32 {
	var answered atomic.Int32
	kf := c.kf
	kf.ControlKey(key.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		resp, ok := answer(req, answered.Load())
		if !ok {
			return nil, nil, false
		}
		answered.Add(1)
		return resp, nil, true
	})
	return &answered
}

// RefuseCommits makes the embedded broker answer the first n OffsetCommit
// requests of group that have a partition match accepts with code for each
// of their partitions, and lets the others through. It returns how many it
// refused. Embedded broker only (see RequireEmbedded).
func (c *Cluster) RefuseCommits(group string, code int16, n int32, match func(kmsg.OffsetCommitRequestTopicPartition) bool) *atomic.Int32 {
	return c.Answer(kmsg.OffsetCommit, func(req kmsg.Request, refused int32) (kmsg.Response, bool) {
		oc := req.(*kmsg.OffsetCommitRequest)
		if oc.Group != group || refused >= n {
			return nil, false
		}
		resp := oc.ResponseKind().(*kmsg.OffsetCommitResponse)
		resp.SetVersion(oc.GetVersion())
		matched := false
		for _, rt := range oc.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				matched = matched || match(rp)
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, matched
	})
}
