//go:build chaos

package chaos

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/kafkatest"
)

// On a real cluster the broker's side of a commit cannot be observed, so a
// consumer observes its own: its Sarama client dials through a tap
// (Net.Proxy.Dialer) whose connections decode every OffsetCommit request as
// it is written. Each request becomes a commitView stamped just before the
// write: a commit request is encoded from marks made after the acks it
// covers, so every record it claims must have been acked before that
// moment. That is the same check as the embedded broker's log of every
// OffsetCommit request it received (applied or rejected), made at the
// sender.
//
// Sarama writes each request with one Write of the whole encoded request,
// and so does franz-go, so a Write that starts with an OffsetCommit header
// holds all of it. On the consumer protocol the commits are safeack's own
// OffsetCommit v9+ (the member id and epoch; v10 names the topic by id),
// sent through its franz-go client, which dials through the same
// Net.Proxy.Dialer (kclient.KgoOptions): the tap sees both engines.

// sentCommit is one OffsetCommit request a consumer wrote to a broker.
type sentCommit struct {
	at         time.Time
	addr       string // the broker it was written to
	group      string
	generation int32
	memberID   string
	offsets    map[int32]kafkatest.CommittedOffset // of the tap's topic
}

// commitTap decodes the OffsetCommit requests of one consumer for topic.
// sent is called after each one was written (from the writing goroutine);
// afterWrite, when set, then runs too: it may act at that exact moment
// (kill the coordinator mid-commit).
type commitTap struct {
	topic   string
	topicID [16]byte // OffsetCommit v10+ names topics by id
	sent    func(sentCommit)

	mu         sync.Mutex
	afterWrite func(sentCommit) bool // true: done, remove it
}

// armAfterWrite sets fn to run after the next OffsetCommit requests are
// written, until it returns true.
func (tp *commitTap) armAfterWrite(fn func(sentCommit) bool) {
	tp.mu.Lock()
	tp.afterWrite = fn
	tp.mu.Unlock()
}

// dialer returns a Sarama proxy dialer that taps every connection, with
// cfg's dial timeout and keep-alive (Sarama applies them only to its own
// dialer).
func (tp *commitTap) install(cfg *sarama.Config) {
	cfg.Net.Proxy.Enable = true
	cfg.Net.Proxy.Dialer = &tapDialer{
		d:   net.Dialer{Timeout: cfg.Net.DialTimeout, KeepAlive: cfg.Net.KeepAlive},
		tap: tp,
	}
}

type tapDialer struct {
	d   net.Dialer
	tap *commitTap
}

func (d *tapDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := d.d.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, addr: addr, tap: d.tap}, nil
}

type tapConn struct {
	net.Conn
	addr string
	tap  *commitTap
}

func (c *tapConn) Write(b []byte) (int, error) {
	at := time.Now()
	req, ok := decodeOffsetCommit(b)
	n, err := c.Conn.Write(b)
	if !ok || err != nil || n != len(b) {
		return n, err
	}
	sc := sentCommit{at: at, addr: c.addr, group: req.Group, generation: req.Generation, memberID: req.MemberID,
		offsets: make(map[int32]kafkatest.CommittedOffset)}
	for _, t := range req.Topics {
		if !c.tap.names(t) {
			continue
		}
		for _, p := range t.Partitions {
			md := ""
			if p.Metadata != nil {
				md = *p.Metadata
			}
			sc.offsets[p.Partition] = kafkatest.CommittedOffset{Offset: p.Offset, Metadata: md}
		}
	}
	if len(sc.offsets) == 0 {
		return n, err
	}
	if c.tap.sent != nil {
		c.tap.sent(sc)
	}
	c.tap.mu.Lock()
	fn := c.tap.afterWrite
	c.tap.mu.Unlock()
	if fn != nil && fn(sc) {
		c.tap.mu.Lock()
		c.tap.afterWrite = nil
		c.tap.mu.Unlock()
	}
	return n, err
}

// names reports whether a topic of a commit request is the tap's: by name,
// or by id (v10+, the consumer protocol's commits).
func (tp *commitTap) names(t kmsg.OffsetCommitRequestTopic) bool {
	if t.Topic != "" {
		return t.Topic == tp.topic
	}
	return t.TopicID != [16]byte{} && t.TopicID == tp.topicID
}

// decodeOffsetCommit decodes b when it is a whole OffsetCommit request:
// size, header (api key, version, correlation id, client id, and the tagged
// fields of flexible versions), body.
func decodeOffsetCommit(b []byte) (*kmsg.OffsetCommitRequest, bool) {
	if len(b) < 14 || int(binary.BigEndian.Uint32(b)) != len(b)-4 ||
		int16(binary.BigEndian.Uint16(b[4:])) != kmsg.OffsetCommit.Int16() {
		return nil, false
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = int16(binary.BigEndian.Uint16(b[6:]))
	rest := b[12:]
	cl := int16(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if cl > 0 {
		if int(cl) > len(rest) {
			return nil, false
		}
		rest = rest[cl:]
	}
	if req.IsFlexible() {
		var err error
		if rest, err = skipTags(rest); err != nil {
			return nil, false
		}
	}
	if err := req.ReadFrom(rest); err != nil {
		return nil, false
	}
	return req, true
}

// skipTags skips a tagged-field section: a count, then per field its tag,
// size and bytes (unsigned varints).
func skipTags(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errors.New("bad tag count")
	}
	b = b[k:]
	for range n {
		if _, k = binary.Uvarint(b); k <= 0 {
			return nil, errors.New("bad tag")
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < size {
			return nil, errors.New("bad tag size")
		}
		b = b[k+int(size):]
	}
	return b, nil
}

// A consumer process reports each commit request it sent as a line:
//
//	C <seq> <unix-nanos> <generation> <p>:<offset>:<hex metadata>[,...]
func commitLine(seq uint64, c sentCommit) string {
	parts := make([]string, 0, len(c.offsets))
	for p, co := range c.offsets {
		parts = append(parts, fmt.Sprintf("%d:%d:%s", p, co.Offset, hex.EncodeToString([]byte(co.Metadata))))
	}
	return fmt.Sprintf("C %d %d %d %s", seq, c.at.UnixNano(), c.generation, strings.Join(parts, ","))
}

func parseCommitLine(line string) (sentCommit, bool) {
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "C" {
		return sentCommit{}, false
	}
	ns, err1 := strconv.ParseInt(f[2], 10, 64)
	gen, err2 := strconv.ParseInt(f[3], 10, 32)
	if err1 != nil || err2 != nil {
		return sentCommit{}, false
	}
	c := sentCommit{at: time.Unix(0, ns), generation: int32(gen), offsets: make(map[int32]kafkatest.CommittedOffset)}
	for _, part := range strings.Split(f[4], ",") {
		x := strings.SplitN(part, ":", 3)
		if len(x) != 3 {
			return sentCommit{}, false
		}
		p, err1 := strconv.ParseInt(x[0], 10, 32)
		o, err2 := strconv.ParseInt(x[1], 10, 64)
		md, err3 := hex.DecodeString(x[2])
		if err1 != nil || err2 != nil || err3 != nil {
			return sentCommit{}, false
		}
		c.offsets[int32(p)] = kafkatest.CommittedOffset{Offset: o, Metadata: string(md)}
	}
	return c, true
}

// sentLog keeps the commit requests the scenario's consumers reported.
type sentLog struct {
	mu    sync.Mutex
	views []commitView
}

func (l *sentLog) add(consumer int, c sentCommit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.views = append(l.views, commitView{
		source:  fmt.Sprintf("commit request #%d sent by consumer %d (gen %d)", len(l.views)+1, consumer, c.generation),
		at:      c.at,
		gen:     c.generation,
		offsets: c.offsets,
	})
}

func (l *sentLog) all() []commitView {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]commitView(nil), l.views...)
}
