package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// The wire tap (-wiretap) timestamps every Kafka request a consumer sends
// and every response it reads, on every connection its Sarama config dials
// (Net.Proxy.Dialer), relative to the run's start: where start-up time goes,
// round trip by round trip, for every Sarama-based contender alike.

type tapEvent struct {
	conn     int
	key      int16
	ver      int16
	corr     int32
	sent     time.Duration // request written
	respFrom time.Duration // first byte of the response read
	respTo   time.Duration // last byte of the response read
	size     int32         // response size
}

type tapRecorder struct {
	mu     sync.Mutex
	base   time.Time
	conns  atomic.Int32
	events []*tapEvent
	byCorr map[[2]int32]*tapEvent
	marks  []tapMark
}

type tapMark struct {
	at   time.Duration
	what string
}

var wiretap atomic.Pointer[tapRecorder]

// tapStart begins recording a run that started at base.
func tapStart(base time.Time) {
	if !opt.wiretap {
		return
	}
	wiretap.Store(&tapRecorder{base: base, byCorr: map[[2]int32]*tapEvent{}})
}

// tapMarkNow notes a client-side event.
func tapMarkNow(what string) {
	r := wiretap.Load()
	if r == nil {
		return
	}
	r.mu.Lock()
	r.marks = append(r.marks, tapMark{time.Since(r.base), what})
	r.mu.Unlock()
}

var apiNames = map[int16]string{0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
	10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup", 18: "ApiVersions", 32: "DescribeConfigs", 36: "SaslAuth"}

func apiName(k int16) string {
	if n, ok := apiNames[k]; ok {
		return n
	}
	return fmt.Sprintf("api%d", k)
}

// tapReport prints the recorded requests up to until (the first delivery)
// and a little after.
func tapReport(label string, first time.Duration) {
	r := wiretap.Swap(nil)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := append([]*tapEvent(nil), r.events...)
	sort.Slice(evs, func(i, j int) bool { return evs[i].sent < evs[j].sent })
	var b strings.Builder
	fmt.Fprintf(&b, "  wiretap %s: first delivery at %.1f ms\n", label, ms(first))
	type line struct {
		at time.Duration
		s  string
	}
	var lines []line
	for _, e := range evs {
		if e.sent > first+50*time.Millisecond {
			continue
		}
		resp := "        -"
		if e.respTo > 0 {
			resp = fmt.Sprintf("%7.1f→%7.1f ms (%d B, rtt %.1f)", ms(e.respFrom), ms(e.respTo), e.size, ms(e.respTo-e.sent))
		}
		lines = append(lines, line{e.sent, fmt.Sprintf("    %7.1f ms  c%d %-15s v%-2d corr %-3d resp %s", ms(e.sent), e.conn, apiName(e.key), e.ver, e.corr, resp)})
	}
	for _, m := range r.marks {
		if m.at > first+50*time.Millisecond {
			continue
		}
		lines = append(lines, line{m.at, fmt.Sprintf("    %7.1f ms  ** %s", ms(m.at), m.what)})
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	for _, l := range lines {
		b.WriteString(l.s)
		b.WriteByte('\n')
	}
	logf("%s", strings.TrimRight(b.String(), "\n"))
}

// tapDialer is a proxy.Dialer for Sarama's Net.Proxy.
type tapDialer struct{ d net.Dialer }

func (t *tapDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := t.d.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	r := wiretap.Load()
	if r == nil {
		return c, nil
	}
	tc := &tapConn{Conn: c, r: r, id: int(r.conns.Add(1))}
	tapMarkNow(fmt.Sprintf("dialed c%d to %s", tc.id, addr))
	return tc, nil
}

// tapConn parses the Kafka frames written and read on one connection.
type tapConn struct {
	net.Conn
	r  *tapRecorder
	id int

	wHdr  []byte
	wLeft int // bytes of the current request frame still to be written
	rHdr  []byte
	rLeft int
	rCur  *tapEvent
	rFrom time.Duration
}

func (c *tapConn) Write(p []byte) (int, error) {
	now := time.Since(c.r.base)
	for q := p; len(q) > 0; {
		if c.wLeft > 0 {
			n := min(c.wLeft, len(q))
			c.wLeft -= n
			q = q[n:]
			continue
		}
		need := 12 - len(c.wHdr)
		n := min(need, len(q))
		c.wHdr = append(c.wHdr, q[:n]...)
		q = q[n:]
		if len(c.wHdr) == 12 {
			size := int(binary.BigEndian.Uint32(c.wHdr))
			e := &tapEvent{conn: c.id, key: int16(binary.BigEndian.Uint16(c.wHdr[4:])), ver: int16(binary.BigEndian.Uint16(c.wHdr[6:])),
				corr: int32(binary.BigEndian.Uint32(c.wHdr[8:])), sent: now}
			c.r.mu.Lock()
			c.r.events = append(c.r.events, e)
			c.r.byCorr[[2]int32{int32(c.id), e.corr}] = e
			c.r.mu.Unlock()
			c.wLeft = size - 8
			c.wHdr = c.wHdr[:0]
		}
	}
	return c.Conn.Write(p)
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	now := time.Since(c.r.base)
	for q := p[:n]; len(q) > 0; {
		if c.rLeft > 0 {
			k := min(c.rLeft, len(q))
			c.rLeft -= k
			q = q[k:]
			if c.rLeft == 0 && c.rCur != nil {
				c.r.mu.Lock()
				c.rCur.respTo = now
				c.r.mu.Unlock()
				c.rCur = nil
			}
			continue
		}
		if len(c.rHdr) == 0 {
			c.rFrom = now
		}
		need := 8 - len(c.rHdr)
		k := min(need, len(q))
		c.rHdr = append(c.rHdr, q[:k]...)
		q = q[k:]
		if len(c.rHdr) == 8 {
			size := int32(binary.BigEndian.Uint32(c.rHdr))
			corr := int32(binary.BigEndian.Uint32(c.rHdr[4:]))
			c.r.mu.Lock()
			e := c.r.byCorr[[2]int32{int32(c.id), corr}]
			if e != nil {
				e.respFrom, e.size = c.rFrom, size
			}
			c.r.mu.Unlock()
			c.rCur = e
			c.rLeft = int(size) - 4
			c.rHdr = c.rHdr[:0]
			if c.rLeft == 0 && e != nil {
				c.r.mu.Lock()
				e.respTo = now
				c.r.mu.Unlock()
				c.rCur = nil
			}
		}
	}
	return n, err
}

// tapTracer marks watermill-kafka's consumer-group handler calls and when
// each claim's channel first holds a record. safeack is not given it: a
// Tracer turns safeack's early first fetch off.
type tapTracer struct{}

func (tapTracer) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }
func (tapTracer) WrapPartitionConsumer(c sarama.PartitionConsumer) sarama.PartitionConsumer {
	return c
}
func (tapTracer) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}
func (tapTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return tapHandler{h}
}

type tapHandler struct{ sarama.ConsumerGroupHandler }

func (h tapHandler) Setup(s sarama.ConsumerGroupSession) error {
	tapMarkNow("Setup begins")
	err := h.ConsumerGroupHandler.Setup(s)
	tapMarkNow("Setup returned")
	return err
}

func (h tapHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	tapMarkNow(fmt.Sprintf("ConsumeClaim p%d (initial offset %d)", c.Partition(), c.InitialOffset()))
	if wiretap.Load() != nil {
		go func() {
			until := time.Now().Add(3 * time.Second)
			for time.Now().Before(until) {
				if len(c.Messages()) > 0 {
					tapMarkNow(fmt.Sprintf("claim p%d channel holds %d records", c.Partition(), len(c.Messages())))
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	return h.ConsumerGroupHandler.ConsumeClaim(s, c)
}

// benchTracer is the tracer of the subscribers: tapTracer with -wiretap.
func benchTracer() wmkafka.SaramaTracer {
	if opt.wiretap {
		return tapTracer{}
	}
	return nil
}
