package share

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/ready"
)

// errNoPartitionsYet is what Ready reports for a member whose heartbeats
// are answered but which holds no partition yet.
var errNoPartitionsYet = errors.New("no partitions assigned yet: the broker assigns a share group's partitions once it has initialized the group's share-partition state for them")

// noPartitionsLogAfter is how long a member, its heartbeats answered,
// waits for partitions before it logs why it gets no records: its
// assignment normally comes with its second heartbeat
// (share.heartbeat.interval.ms, 5 s by default).
const noPartitionsLogAfter = 12 * time.Second

// assignWait follows whether a member holds partitions, for Ready and for
// the log line that says why records do not flow yet. kgo tells no share
// assignment; it sends a share fetch only for the partitions it was
// assigned, so a member's first share fetch answered is the sign. A
// broker's first share group waits longest: the broker creates and loads
// its share-state topic (__share_group_state) first, and meanwhile the
// group coordinator's initialization of the group's state fails and is
// retried with backoff (docs/share-groups.md).
type assignWait struct {
	// heartbeatOK: the member's last heartbeat was answered.
	heartbeatOK atomic.Bool
	// answeredAt: when its first heartbeat was answered (unix nanos, 0
	// before); fetched: a share fetch of the member was answered; logged:
	// the wait was logged.
	answeredAt atomic.Int64
	fetched    atomic.Bool
	logged     atomic.Bool
}

// phase is the member's phase after a heartbeat answered (err nil) or not.
func (m *member) phase(err error) (ready.Phase, error) {
	m.assign.heartbeatOK.Store(err == nil)
	switch {
	case err != nil:
		return ready.Connecting, err
	case !m.assign.fetched.Load():
		m.noteAnswered()
		return ready.Joining, errNoPartitionsYet
	default:
		return ready.Consuming, nil
	}
}

// noteAnswered starts, at the member's first heartbeat answered, the wait
// after which it logs that it holds no partitions.
func (m *member) noteAnswered() {
	if !m.assign.answeredAt.CompareAndSwap(0, time.Now().UnixNano()) {
		return
	}
	time.AfterFunc(noPartitionsLogAfter, func() {
		sub := m.sub
		if m.assign.fetched.Load() || sub.stop.Err() != nil {
			return
		}
		m.assign.logged.Store(true)
		sub.logger.Info("Share group member has no partitions yet, so it gets no records: the broker assigns them once it has initialized the group's share-partition state. "+
			"On a cluster where no share group ran before, the broker first creates and loads its share-state topic (__share_group_state) and retries the initialization with growing backoff meanwhile (seconds, up to about 30 s); "+
			"a topic that does not exist has no partitions to assign. Records wait at the broker: none is lost", watermill.LogFields{
			"member": m.id,
			"waited": time.Since(time.Unix(0, m.assign.answeredAt.Load())).Round(time.Millisecond).String(),
		})
	})
}

// noteFetchAnswered records that a share fetch of the member was answered:
// it holds partitions. The first makes it ready if its last heartbeat was
// answered.
func (m *member) noteFetchAnswered() {
	if !m.assign.fetched.CompareAndSwap(false, true) {
		return
	}
	sub := m.sub
	if m.assign.logged.Load() {
		sub.logger.Info("Share group member got its partitions", watermill.LogFields{
			"member": m.id,
			"waited": time.Since(time.Unix(0, m.assign.answeredAt.Load())).Round(time.Millisecond).String(),
		})
	}
	if sub.stop.Err() == nil && m.assign.heartbeatOK.Load() && m.refusal.Load() == nil {
		sub.host.SetPhase(m, sub.topic, ready.Consuming, nil)
	}
}
