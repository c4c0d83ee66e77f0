//go:build kfakejoin

// Package repro reproduces a classic consumer group member whose JoinGroup
// kfake never answers: the member rejoins during a rebalance that lasts
// longer than its session timeout, and kfake removes it at that timeout
// while its JoinGroup waits. See ../kfake-join-dropped.md. Run:
//
//	go test -tags kfakejoin -count=1 -v ./docs/upstream/kfake-join-dropped/
package repro

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const group = "g"

// member is one classic group member, on a client (connection) of its own:
// a broker answers one connection's requests in order.
type member struct {
	cl         *kgo.Client
	id         string
	generation int32
	session    int32 // milliseconds
}

func newMember(t *testing.T, kf *kfake.Cluster, session time.Duration) *member {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &member{cl: cl, session: int32(session.Milliseconds())}
}

// join sends JoinGroup (again with the member id a MEMBER_ID_REQUIRED
// answer assigns) and waits up to timeout for the answer.
func (m *member) join(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.MemberID, req.ProtocolType = group, m.id, "consumer"
		req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = m.session, 8000
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = "range", []byte{0, 0, 0, 0, 0, 0, 0, 0}
		req.Protocols = append(req.Protocols, p)
		resp, err := req.RequestWith(ctx, m.cl)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); errors.Is(err, kerr.MemberIDRequired) {
			m.id = resp.MemberID
			continue
		} else if err != nil {
			return err
		}
		m.generation = resp.Generation
		return nil
	}
}

// sync sends SyncGroup, with an empty assignment for each of members when
// it is the leader's.
func (m *member) sync(members ...*member) error {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.MemberID, req.Generation = group, m.id, m.generation
	for _, o := range members {
		a := kmsg.NewSyncGroupRequestGroupAssignment()
		a.MemberID = o.id
		req.GroupAssignment = append(req.GroupAssignment, a)
	}
	resp, err := req.RequestWith(context.Background(), m.cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

func (m *member) heartbeat() error {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.MemberID, req.Generation = group, m.id, m.generation
	resp, err := req.RequestWith(context.Background(), m.cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// TestRejoinAnsweredAfterSessionTimeout: A (session 2 s) and C (session 5 s)
// are a stable group; C then dies. B joins, and A rejoins at once. The
// rebalance waits for C, up to C's session timeout; A waits in JoinGroup
// meanwhile, longer than its own session timeout. Apache Kafka keeps a
// member awaiting a join alive and answers it when the rebalance completes
// (once C is removed, about 5 s in). kfake removes A at its session timeout
// and never answers its JoinGroup: the client waits for its request
// timeout.
func TestRejoinAnsweredAfterSessionTimeout(t *testing.T) {
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	a, c, b := newMember(t, kf, 2*time.Second), newMember(t, kf, 5*time.Second), newMember(t, kf, 2*time.Second)

	if err := a.join(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := a.sync(a); err != nil {
		t.Fatal(err)
	}
	// C joins; A rejoins when its heartbeat says so; both sync.
	cJoined := make(chan error, 1)
	go func() { cJoined <- c.join(10 * time.Second) }()
	waitRebalance(t, a)
	if err := a.join(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := <-cJoined; err != nil {
		t.Fatal(err)
	}
	cSynced := make(chan error, 1)
	go func() { cSynced <- c.sync() }()
	if err := a.sync(a, c); err != nil {
		t.Fatal(err)
	}
	if err := <-cSynced; err != nil {
		t.Fatal(err)
	}

	// C is dead from here on. B joins; A rejoins and waits for C.
	bJoined := make(chan error, 1)
	go func() { bJoined <- b.join(20 * time.Second) }()
	waitRebalance(t, a)
	start := time.Now()
	err = a.join(15 * time.Second)
	t.Logf("A's JoinGroup: %v after %v; group now %+v", err, time.Since(start).Round(time.Millisecond), kf.GroupInfo(group))
	if err != nil {
		t.Errorf("A's JoinGroup, sent during the rebalance, was not answered (C's session, 5 s, ended the rebalance): %v", err)
	}
	if err := <-bJoined; err != nil {
		t.Errorf("B's JoinGroup: %v", err)
	}
}

// waitRebalance heartbeats as m until the group asks it to rejoin.
func waitRebalance(t *testing.T, m *member) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := m.heartbeat(); errors.Is(err, kerr.RebalanceInProgress) {
			return
		} else if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
	}
	t.Fatal("no rebalance within 5 s")
}
