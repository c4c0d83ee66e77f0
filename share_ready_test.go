package safeack_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestShareReadyWaitsForPartitions: a member whose heartbeats are answered
// without partitions, as a broker answers while it initializes the group's
// share-partition state (on a new broker, for many seconds while it
// creates and loads its share-state topic), is not ready: Ready says it
// has no partitions yet. Once the broker assigns them, WaitReady returns
// and the record produced meanwhile arrives.
func TestShareReadyWaitsForPartitions(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	c.RequireEmbedded(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	var initializing atomic.Bool
	initializing.Store(true)
	answered := c.Answer(kmsg.ShareGroupHeartbeat, func(req kmsg.Request, _ int32) (kmsg.Response, bool) {
		hb := req.(*kmsg.ShareGroupHeartbeatRequest)
		if hb.GroupID != group || !initializing.Load() {
			return nil, false
		}
		resp := hb.ResponseKind().(*kmsg.ShareGroupHeartbeatResponse)
		resp.MemberID = &hb.MemberID
		resp.MemberEpoch = max(hb.MemberEpoch, 1)
		resp.HeartbeatIntervalMillis = 500
		resp.Assignment = &kmsg.ShareGroupHeartbeatResponseAssignment{} // no partitions yet
		return resp, true
	})
	sub := newShareSub(t, c, group, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("waiting")})

	kafkatest.WaitFor(t, 20*time.Second, "three heartbeats answered without partitions", func() bool { return answered.Load() >= 3 })
	err = sub.Ready()
	require.ErrorIs(t, err, safeack.ErrNotReady, "a member without partitions is ready")
	require.ErrorContains(t, err, "no partitions assigned yet")
	t.Logf("Ready while the broker initializes: %v", err)

	initializing.Store(false) // the broker has initialized the group's state
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	require.NoError(t, sub.WaitReady(wctx))
	m := receive(t, msgs, 20*time.Second, "the record produced while the member had no partitions")
	require.Equal(t, "waiting", string(m.Payload))
	m.Ack()
}
