package safeack

import (
	"context"
	"time"
)

// rejoinWindow is how long consumeGroup retries a failed join with the
// same consumer group before it replaces the Sarama client: twice the
// session timeout from the first failure. A coordinator that died is
// replaced once the cluster fences its broker (broker.session.timeout.ms,
// typically about a consumer session timeout), and the new one keeps the
// group's members for a session timeout after loading the group; within
// that the member id is worth keeping. After it the coordinator has
// forgotten the member anyway (Sarama then joins under a new id), and a new
// client, from the configured Brokers, is the better bet.
func (sub *subscription) rejoinWindow() time.Duration {
	return 2 * sub.cfg.OverwriteSaramaConfig.Consumer.Group.Session.Timeout
}

// rejoinRetry paces the retries of a failed join: rejoinMinBackoff after
// the first failure, doubling up to rejoinMaxBackoff, within a window that
// starts at the first failure since the last successful Consume.
type rejoinRetry struct {
	first    time.Time
	backoff  time.Duration
	failures int
}

const (
	rejoinMinBackoff = 100 * time.Millisecond
	rejoinMaxBackoff = time.Second
)

func (r *rejoinRetry) reset() { *r = rejoinRetry{} }

// next records a failure at now and returns how long to wait before the
// next attempt, or false when the window since the first failure is over
// (the caller gives up on this consumer group).
func (r *rejoinRetry) next(now time.Time, window time.Duration) (time.Duration, bool) {
	r.failures++
	if r.first.IsZero() {
		r.first = now
		r.backoff = rejoinMinBackoff
	} else {
		r.backoff = min(2*r.backoff, rejoinMaxBackoff)
	}
	left := window - now.Sub(r.first)
	if left <= 0 {
		return 0, false
	}
	return min(r.backoff, left), true
}

// sleepCtx waits d, and reports false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
