package safeack_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// shareRecorder is a safeack.Observer that records, per record value,
// what its ShareDeliveryObservers were told, in order.
type shareRecorder struct {
	mu         sync.Mutex
	deliveries []safeack.Delivery
	told       map[string][]string // value → "delivered:<dc>", outcomes, "ack:<ack>/<reason>[/err]"
	acks       map[string][]safeack.ShareAcknowledgement
	nackErrs   map[string][]error
	commits    int
}

type recKey struct{}

func newShareRecorder() *shareRecorder {
	return &shareRecorder{told: map[string][]string{}, acks: map[string][]safeack.ShareAcknowledgement{}, nackErrs: map[string][]error{}}
}

func (r *shareRecorder) Delivered(ctx context.Context, d safeack.Delivery) (context.Context, safeack.DeliveryObserver) {
	// Keyed by delivery: the broker's answer to a release may come
	// after the record's next delivery (both ride on one fetch).
	v := string(d.Record.Value) + "#" + itoa(int64(d.DeliveryCount))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deliveries = append(r.deliveries, d)
	r.told[v] = append(r.told[v], "delivered:"+itoa(int64(d.DeliveryCount)))
	return context.WithValue(ctx, recKey{}, v), &shareRecorderDelivery{r: r, v: v}
}

func (r *shareRecorder) Committed(safeack.CommitEvent) {
	r.mu.Lock()
	r.commits++
	r.mu.Unlock()
}

func (r *shareRecorder) get(v string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.told[v]...)
}

type shareRecorderDelivery struct {
	r *shareRecorder
	v string
}

func (d *shareRecorderDelivery) Answered(o safeack.Outcome, err error) {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	d.r.told[d.v] = append(d.r.told[d.v], o.String())
	if o == safeack.OutcomeNack {
		d.r.nackErrs[d.v] = append(d.r.nackErrs[d.v], err)
	}
}

func (d *shareRecorderDelivery) Acknowledged(a safeack.ShareAcknowledgement) {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	s := "ack:" + a.Ack.String() + "/" + a.Reason.String()
	if a.Err != nil {
		s += "/err"
	}
	d.r.told[d.v] = append(d.r.told[d.v], s)
	d.r.acks[d.v] = append(d.r.acks[d.v], a)
}

// TestShareObserverOutcomes: a ShareSubscriber's Observer is told of each
// delivery (the share group, the delivery count, its context reaching the
// handler), then of the answer, then of the acknowledgement sent and the
// broker's answer: an ack is accepted; a nack released, and accepted at its
// second delivery; RejectPoison's failure rejected with the handler's
// error; a deferred completion deferred then acked; a message unanswered
// when the subscriber closes abandoned and released (closing). Committed is
// never called, and Answered always precedes Acknowledged.
func TestShareObserverOutcomes(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	rec := newShareRecorder()
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) { cfg.Observer = rec })
	require.Equal(t, group, sub.ShareGroup())

	hold := make(chan struct{})
	var ctxSeen sync.Map
	mwRouter(t, sub, topic, func(msg *message.Message) error {
		dc, _ := safeack.MessageDeliveryCountFromCtx(msg.Context())
		ctxSeen.Store(string(msg.Payload)+"#"+itoa(int64(dc)), msg.Context().Value(recKey{}))
		switch string(msg.Payload) {
		case "nack-once":
			if dc == 1 {
				msg.Nack() // itself: RejectPoison would reject a failure
			}
		case "poison":
			return errors.New("cannot handle")
		case "defer":
			comp, err := safeack.Defer(msg)
			require.NoError(t, err)
			go comp.Done()
		case "hold":
			<-hold
		}
		return nil
	}, safeack.RejectPoison, safeack.DeferredCompletion)
	t.Cleanup(func() { close(hold) })

	c.Produce(t, topic,
		kafkatest.Record{Value: []byte("ack")},
		kafkatest.Record{Value: []byte("nack-once")},
		kafkatest.Record{Value: []byte("defer")},
	)
	if !kafkatest.Poll(mwWait, 10*time.Millisecond, func() bool {
		return len(rec.get("ack#1")) == 3 && len(rec.get("nack-once#1")) == 3 && len(rec.get("nack-once#2")) == 3 && len(rec.get("defer#1")) == 4
	}) {
		t.Fatalf("not every record acknowledged and answered: %v %v %v %v", rec.get("ack#1"), rec.get("nack-once#1"), rec.get("nack-once#2"), rec.get("defer#1"))
	}
	assert.Equal(t, []string{"delivered:1", "ack", "ack:accept/answer"}, rec.get("ack#1"))
	assert.Equal(t, []string{"delivered:1", "nack", "ack:release/answer"}, rec.get("nack-once#1"))
	assert.Equal(t, []string{"delivered:2", "ack", "ack:accept/answer"}, rec.get("nack-once#2"))
	assert.Equal(t, []string{"delivered:1", "deferred", "ack", "ack:accept/answer"}, rec.get("defer#1"))

	// RejectPoison is outermost: it sees the error, the router nacks, the
	// record is rejected; the observer gets the handler's error.
	c.Produce(t, topic, kafkatest.Record{Value: []byte("poison")})
	kafkatest.WaitFor(t, mwWait, "the poison record acknowledged", func() bool { return len(rec.get("poison#1")) == 3 })
	assert.Equal(t, []string{"delivered:1", "nack", "ack:reject/poison"}, rec.get("poison#1"))
	rec.mu.Lock()
	perr := rec.nackErrs["poison#1"]
	rec.mu.Unlock()
	require.Len(t, perr, 1)
	assert.ErrorIs(t, perr[0], safeack.ErrRejected)
	assert.ErrorContains(t, perr[0], "cannot handle")

	// A message still in its handler at Close: abandoned after the drain,
	// released, and the release reported before Close returns.
	c.Produce(t, topic, kafkatest.Record{Value: []byte("hold")})
	kafkatest.WaitFor(t, mwWait, "the held record delivered", func() bool { return len(rec.get("hold#1")) == 1 })
	require.NoError(t, sub.Close())
	got := rec.get("hold#1")
	require.Len(t, got, 3, "%v", got)
	assert.Equal(t, []string{"delivered:1", "abandoned"}, got[:2])
	assert.Contains(t, []string{"ack:release/closing", "ack:release/closing/err"}, got[2])

	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Zero(t, rec.commits, "Committed called for a share group")
	for _, d := range rec.deliveries {
		assert.Equal(t, group, d.Group)
		assert.Equal(t, topic, d.Record.Topic)
		assert.NotNil(t, d.Message)
		key := string(d.Record.Value) + "#" + itoa(int64(d.DeliveryCount))
		v, _ := ctxSeen.Load(key)
		assert.Equal(t, key, v, "the Observer's context did not reach the handler")
	}
	for v, acks := range rec.acks {
		for _, a := range acks {
			if v != "hold#1" {
				assert.NoError(t, a.Err, v)
			}
		}
	}
}
