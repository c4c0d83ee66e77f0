// Package backoff paces the retries of a subscription: waits that start
// short and double up to a bound, each cut short when its context ends.
//
// One pace serves every retry that waits on the group coordinator (a
// rejoin, a start commit it has not taken yet): it recovers within a few
// hundred milliseconds when the coordinator is only moving, and costs at
// most one request a second while it stays away.
package backoff

import (
	"context"
	"time"
)

// Bounds of a Doubling's waits.
const (
	Min = 100 * time.Millisecond
	Max = time.Second
)

// Doubling is a wait that starts at Min and doubles after each use, up to
// Max. The zero value is ready to use; it is not safe for concurrent use.
type Doubling struct {
	last time.Duration
}

// Next returns how long to wait before the next attempt.
func (d *Doubling) Next() time.Duration {
	if d.last == 0 {
		d.last = Min
	} else {
		d.last = min(2*d.last, Max)
	}
	return d.last
}

// Reset makes the next wait Min again.
func (d *Doubling) Reset() { d.last = 0 }

// Sleep waits d, and reports false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	return Wait(ctx, d, nil)
}

// Wait waits d, and reports false when ctx ended or stop was closed first
// (a nil stop is never closed). For d <= 0 it does not wait: it reports
// whether neither had ended, without the race of a timer that is due at
// once against a context already ended.
func Wait(ctx context.Context, d time.Duration, stop <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-ctx.Done():
			return false
		case <-stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
