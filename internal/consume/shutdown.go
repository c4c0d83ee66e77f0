package consume

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/safeack/safeack/internal/kclient"
)

// CloseGrace is what the end of a subscription (leaving the group, closing
// connections) may take after its final commit before the connections
// still waiting for a broker are closed under it; and then what Close
// waits for the subscription's last steps (see Subscriber.Close).
const CloseGrace = time.Second

// Bounds of closeCommitWait.
const (
	minCloseCommitWait = time.Second
	maxCloseCommitWait = 5 * time.Second
)

// closeCommitWait is how long a stopping subscription's final commit may
// wait for the brokers: DrainTimeout, within [minCloseCommitWait,
// maxCloseCommitWait]. (Rebalance.Timeout, which bounds finalCommitWait,
// does not apply: the member is leaving.) A broker that has not answered
// by then is not waited for: Sarama's own timeouts (Net.ReadTimeout, 30 s,
// for each of its attempts) would hold Close for minutes.
func (c *Options) closeCommitWait() time.Duration {
	return min(max(c.DrainTimeout, minCloseCommitWait), maxCloseCommitWait)
}

// CloseBudget is the most a subscription takes to stop once Close is
// called (or its Subscribe context ends): the drain, the final commit,
// then CloseGrace to leave. Whatever still waits for a broker then is
// abandoned.
func (c *Options) CloseBudget() time.Duration {
	return c.DrainTimeout + c.closeCommitWait() + CloseGrace
}

// shutdown bounds the end of one subscription whatever the brokers do:
// gone, refusing, or not answering at all (Sarama then waits out
// Net.ReadTimeout on each request, and retries). Once the subscription
// stops, a deadline runs (CloseBudget, brought forward by the steps that
// finish early, see arm); when it passes, abandoned closes: the
// connections still waiting for a broker are closed under their callers,
// an open transaction is given up, and nothing waits for a broker again.
type shutdown struct {
	stopped   chan struct{} // closed once the subscription stops
	abandoned chan struct{} // closed at the deadline

	stopOnce, abandonOnce sync.Once
	mu                    sync.Mutex
	deadline              time.Time
	timer                 *time.Timer
}

func newShutdown() *shutdown {
	return &shutdown{stopped: make(chan struct{}), abandoned: make(chan struct{})}
}

// stop marks the subscription as stopping and sets the deadline within
// from now (or sooner, if one is set).
func (s *shutdown) stop(within time.Duration) {
	s.stopOnce.Do(func() { close(s.stopped) })
	s.arm(within)
}

// isStopping reports whether stop was called.
func (s *shutdown) isStopping() bool {
	select {
	case <-s.stopped:
		return true
	default:
		return false
	}
}

// arm brings the deadline forward to within from now; a later one is
// ignored. It does nothing before stop: a rebalance is not a shutdown.
func (s *shutdown) arm(within time.Duration) {
	if !s.isStopping() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	at := time.Now().Add(within)
	if s.timer != nil {
		if !at.Before(s.deadline) {
			return
		}
		s.timer.Stop()
	}
	s.deadline = at
	s.timer = time.AfterFunc(within, s.abandon)
}

func (s *shutdown) abandon() {
	s.abandonOnce.Do(func() { close(s.abandoned) })
}

// isAbandoned reports whether the deadline passed.
func (s *shutdown) isAbandoned() bool {
	select {
	case <-s.abandoned:
		return true
	default:
		return false
	}
}

// within returns a context that ends after d or when the deadline passes.
// Call cancel when done with it.
func (s *shutdown) within(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-s.abandoned:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// waitOr waits for done until ctx ends; it reports whether done closed.
func waitOr(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// callWithin runs f on a goroutine of its own and waits for it until ctx
// ends; it reports whether f returned. A broker call left behind ends
// when its connection does (at the latest, once the shutdown deadline
// closes it).
func callWithin(ctx context.Context, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	return waitOr(ctx, done)
}

// fetchCommittedWithin is reads.CommittedOnce, given up when ctx ends.
func fetchCommittedWithin(ctx context.Context, reads clusterReads, partitions []int32) (map[int32]kclient.CommittedOffset, error) {
	type result struct {
		held map[int32]kclient.CommittedOffset
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		held, err := reads.CommittedOnce(partitions)
		ch <- result{held, err}
	}()
	select {
	case r := <-ch:
		return r.held, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("no answer from the group coordinator in time: %w", ctx.Err())
	}
}

// positions formats offsets by partition as "p:offset p:offset ...", in
// partition order, for the logs.
func positions(offsets map[int32]int64) string {
	parts := slices.Sorted(maps.Keys(offsets))
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:%d", p, offsets[p])
	}
	return b.String()
}
