package kclient

import (
	"errors"
	"sync"

	"github.com/IBM/sarama"
)

// CoordinatorClient is a sarama.Client whose group coordinator is reached
// over a connection of its own instead of the one the client shares with
// every other request to that broker.
//
// Sarama keeps one connection per broker, and a broker answers the requests
// of one connection in order. A Fetch that finds no new records waits up to
// Consumer.MaxWaitTime (500 ms by default) for some, and an OffsetCommit
// sent to the same broker behind it waits as long: the last records of a
// burst were committed up to that much later than their acks. With the
// coordinator on its own connection, commits, the read-backs of committed
// offsets, heartbeats and group membership requests never queue behind a
// Fetch, and fetching keeps Sarama's (or the caller's) MaxWaitTime. The
// cost is one more connection per subscription to the coordinator broker.
//
// Every other call goes to the wrapped client. Close closes the
// coordinator connections and then the wrapped client. The Broker that
// Coordinator returns is made from the coordinator's address and has no
// broker id (ID is -1): ask the wrapped client for the id.
type CoordinatorClient struct {
	sarama.Client

	// OwnConfig opens the coordinator connections; nil: the wrapped client's.
	OwnConfig *sarama.Config

	mu     sync.Mutex
	closed bool
	// kept: the coordinator is not looked up any more (see keep).
	kept bool
	own  map[string]*sarama.Broker // by coordinator address: the current one
}

func NewCoordinatorClient(c sarama.Client) *CoordinatorClient {
	return &CoordinatorClient{Client: c, own: make(map[string]*sarama.Broker)}
}

// Coordinator returns the group coordinator the wrapped client knows (it
// finds it as usual), on a connection of this client's own, opened (again)
// when needed: Sarama closes a coordinator connection after a failed
// request and expects the next Coordinator call to reopen it, as the
// client's own cached brokers do.
func (c *CoordinatorClient) Coordinator(group string) (*sarama.Broker, error) {
	c.mu.Lock()
	closed, kept := c.closed, c.kept
	var known string
	for addr := range c.own {
		known = addr
	}
	c.mu.Unlock()
	if closed {
		// Not looked up: Sarama's lookup retries, sleeping, while the
		// brokers cannot be reached.
		return nil, sarama.ErrClosedClient
	}
	addr := known
	if !kept || known == "" {
		shared, err := c.Client.Coordinator(group)
		if err != nil {
			return nil, err
		}
		addr = shared.Addr()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, sarama.ErrClosedClient
	}
	b := c.own[addr]
	if b == nil {
		// A new coordinator (the first, or the group moved): the
		// connection to a former one is closed, as the client closes a
		// broker it replaces.
		for old, ob := range c.own {
			delete(c.own, old)
			go closeBroker(ob)
		}
		b = sarama.NewBroker(addr)
		c.own[addr] = b
	}
	conf := c.OwnConfig
	if conf == nil {
		conf = c.Client.Config()
	}
	if err := b.Open(conf); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
		return nil, err
	}
	return b, nil
}

// RefreshCoordinator looks the coordinator up again, unless it is kept.
func (c *CoordinatorClient) RefreshCoordinator(group string) error {
	c.mu.Lock()
	kept := c.kept && len(c.own) > 0
	c.mu.Unlock()
	if kept {
		return nil
	}
	return c.Client.RefreshCoordinator(group)
}

// keep makes Coordinator answer the coordinator it has a connection to
// without looking it up through the wrapped client, whose connections
// were closed (see ConsumeClaim): the subscription is stopping, and its
// last requests go to the coordinator it knows.
func (c *CoordinatorClient) Keep() {
	c.mu.Lock()
	c.kept = true
	c.mu.Unlock()
}

// refuse makes Coordinator fail from now on: the subscription's
// connections were abandoned (see ConnTracker).
func (c *CoordinatorClient) Refuse() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// Close closes the coordinator connections, then the wrapped client.
func (c *CoordinatorClient) Close() error {
	c.mu.Lock()
	own := c.own
	c.own, c.closed = nil, true
	c.mu.Unlock()
	for _, b := range own {
		closeBroker(b)
	}
	return c.Client.Close()
}

func closeBroker(b *sarama.Broker) {
	if ok, _ := b.Connected(); ok {
		_ = b.Close()
	}
}
