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
