package safeack_test

import (
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestProxyDialerCarriesCommits: a user's Net.Proxy.Dialer is how every
// connection of the Subscriber is made, on either protocol: on the consumer
// protocol the fetches, heartbeats and safeack's own OffsetCommits go
// through its franz-go client, which must dial through it too (a proxy, a
// tunnel, an audit of the wire). The dialer here sees the OffsetCommit
// requests written through its connections; on the consumer protocol they
// are v9+ (the member epoch).
func TestProxyDialerCarriesCommits(t *testing.T) {
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		const partitions, records = 3, 300
		c, topic, group := kafkatest.StartTopic(t, partitions)
		c.ProduceN(t, topic, partitions, records, nil)
		d := &requestDialer{}
		acks, watch := watchCommits(t, c, group, topic)
		sub := newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.CommitInterval = 50 * time.Millisecond
			cfg.OverwriteSaramaConfig.Net.Proxy.Enable = true
			cfg.OverwriteSaramaConfig.Net.Proxy.Dialer = d
		})
		handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) { acks.ack(m) })
		hwm := c.HighWaterMarks(t, topic)
		acks.waitAllAcked(t, c, topic, 30*time.Second)
		watch.waitCommitted(t, hwm, 15*time.Second)
		require.Positive(t, d.dials(), "no connection was dialed through the user's dialer")
		if c.Secured() {
			return // TLS above the dialer: the requests cannot be read there
		}
		versions := d.commitVersions()
		require.NotEmpty(t, versions, "no OffsetCommit went through the user's dialer")
		if p == safeack.GroupProtocolConsumer {
			for _, v := range versions {
				require.GreaterOrEqual(t, v, int16(9), "a consumer-protocol commit (member epoch) went through the dialer as v%d", v)
			}
		}
	})
}

// requestDialer dials plain TCP and notes the version of every OffsetCommit
// request written through its connections (Sarama and franz-go write each
// request with one Write: size, API key, version, ...).
type requestDialer struct {
	mu       sync.Mutex
	n        int
	versions []int16
}

func (d *requestDialer) Dial(network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).Dial(network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.n++
	d.mu.Unlock()
	return &requestConn{Conn: conn, d: d}, nil
}

func (d *requestDialer) dials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

func (d *requestDialer) commitVersions() []int16 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int16(nil), d.versions...)
}

type requestConn struct {
	net.Conn
	d *requestDialer
}

func (c *requestConn) Write(b []byte) (int, error) {
	if len(b) >= 8 && int16(binary.BigEndian.Uint16(b[4:])) == kmsg.OffsetCommit.Int16() {
		c.d.mu.Lock()
		c.d.versions = append(c.d.versions, int16(binary.BigEndian.Uint16(b[6:])))
		c.d.mu.Unlock()
	}
	return c.Conn.Write(b)
}
