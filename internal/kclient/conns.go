package kclient

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// errConnsAbandoned is what a connection attempt of an abandoned client
// fails with.
var errConnsAbandoned = errors.New("safeack: the subscription stopped; its connections were closed")

// ConnTracker dials the connections of one Sarama client and can close
// them all at once (abandon). Closing a sarama.Broker does not end a
// request waiting for its answer: Broker.Close waits for the broker's
// lock, which a synchronous request (a heartbeat, an OffsetFetch, an
// EndTxn) holds until the answer comes or Net.ReadTimeout passes (30 s by
// default, and Sarama retries). Closing the socket under it fails that
// request at once. Once abandoned, no new connection is made: the client
// fails fast instead of dialing a broker again.
type ConnTracker struct {
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	ctx    context.Context // cancelled by abandon: dials in progress end
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// contextDialer is a dialer that can be cancelled.
type contextDialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// TrackConns makes cfg, a copy of the caller's that only one client uses,
// dial through a new ConnTracker: through cfg's own Net.Proxy.Dialer when
// it has one, otherwise as Sarama does (Net.DialTimeout, Net.KeepAlive,
// Net.LocalAddr). TLS and SASL still apply on top, as Sarama does them
// after the dial.
func TrackConns(cfg *sarama.Config) *ConnTracker {
	t := &ConnTracker{conns: make(map[*trackedConn]struct{})}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	switch user := cfg.Net.Proxy.Dialer; {
	case cfg.Net.Proxy.Enable && user != nil:
		if cd, ok := user.(contextDialer); ok {
			t.dial = cd.DialContext
		} else {
			t.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialUntil(ctx, func() (net.Conn, error) { return user.Dial(network, addr) })
			}
		}
	default:
		d := &net.Dialer{Timeout: cfg.Net.DialTimeout, KeepAlive: cfg.Net.KeepAlive, LocalAddr: cfg.Net.LocalAddr}
		t.dial = d.DialContext
	}
	cfg.Net.Proxy.Enable = true
	cfg.Net.Proxy.Dialer = t
	// Sarama's retry loops (a metadata refresh, a coordinator lookup, a
	// partition consumer's restart, a transaction's steps) sleep between
	// attempts and take no context: a background refresh or a commit
	// loop's read-back would go on sleeping after the shutdown deadline,
	// and client.Close waits for the refresh. Once abandoned, every
	// attempt fails at once on the refused connections, so they retry
	// without sleeping and end within the shutdown's bound.
	cfg.Metadata.Retry.BackoffFunc = t.noWaitOnceAbandoned(cfg.Metadata.Retry.BackoffFunc, cfg.Metadata.Retry.Backoff)
	cfg.Consumer.Retry.BackoffFunc = t.noWaitOnceAbandoned1(cfg.Consumer.Retry.BackoffFunc, cfg.Consumer.Retry.Backoff)
	cfg.Producer.Retry.BackoffFunc = t.noWaitOnceAbandoned(cfg.Producer.Retry.BackoffFunc, cfg.Producer.Retry.Backoff)
	cfg.Producer.Transaction.Retry.BackoffFunc = t.noWaitOnceAbandoned(cfg.Producer.Transaction.Retry.BackoffFunc, cfg.Producer.Transaction.Retry.Backoff)
	return t
}

// noWaitOnceAbandoned is a Sarama retry backoff: user's (or the fixed
// backoff when user is nil) until the tracker is abandoned, none after.
func (t *ConnTracker) noWaitOnceAbandoned(user func(retries, maxRetries int) time.Duration, fixed time.Duration) func(retries, maxRetries int) time.Duration {
	return func(retries, maxRetries int) time.Duration {
		if t.ctx.Err() != nil {
			return 0
		}
		if user != nil {
			return user(retries, maxRetries)
		}
		return fixed
	}
}

// noWaitOnceAbandoned1 is noWaitOnceAbandoned for Consumer.Retry, whose
// backoff takes the retry count alone.
func (t *ConnTracker) noWaitOnceAbandoned1(user func(retries int) time.Duration, fixed time.Duration) func(retries int) time.Duration {
	return func(retries int) time.Duration {
		if t.ctx.Err() != nil {
			return 0
		}
		if user != nil {
			return user(retries)
		}
		return fixed
	}
}

// dialUntil runs dial and gives up when ctx ends; a connection made after
// that is closed.
func dialUntil(ctx context.Context, dial func() (net.Conn, error)) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dial()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, errConnsAbandoned
	}
}

// Dial is what Sarama calls (Net.Proxy.Dialer).
func (t *ConnTracker) Dial(network, addr string) (net.Conn, error) {
	if t.ctx.Err() != nil {
		return nil, errConnsAbandoned
	}
	conn, err := t.dial(t.ctx, network, addr)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, errConnsAbandoned
		}
		return nil, err
	}
	tc := &trackedConn{Conn: conn, t: t}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = conn.Close()
		return nil, errConnsAbandoned
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc, nil
}

// abandon closes every connection and refuses new ones.
func (t *ConnTracker) Abandon() {
	t.cancel()
	t.mu.Lock()
	conns := t.conns
	t.conns, t.closed = nil, true
	t.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

// TrackedClient is a subscription's client with the tracker of its
// connections (see consumeOnce).
type TrackedClient struct {
	sarama.Client
	Conns      *ConnTracker // the client's own
	CoordConns *ConnTracker // its CoordinatorClient's, if it has one
}

// abandon closes every connection of the client and refuses new ones.
func (c *TrackedClient) Abandon() {
	if cc, ok := c.Client.(*CoordinatorClient); ok {
		cc.Refuse()
	}
	c.Conns.Abandon()
	if c.CoordConns != nil {
		c.CoordConns.Abandon()
	}
}

// trackedConn leaves its tracker when closed.
type trackedConn struct {
	net.Conn
	t *ConnTracker
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}
