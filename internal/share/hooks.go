package share

import (
	"fmt"
	"net"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// readyHook follows the share group heartbeats for Ready. A heartbeat
// read tells both ways; a heartbeat that could not be written, or a failed
// connection to the broker that answered the last one, tells that the
// member is cut off: kgo then calls no read hook at all (a reset connection
// fails the write, a refused dial fails before any write), and Ready would
// go on reporting the last answer.
type readyHook struct{ m *member }

var (
	_ kgo.HookBrokerRead    = readyHook{}
	_ kgo.HookBrokerWrite   = readyHook{}
	_ kgo.HookBrokerConnect = readyHook{}
)

func (h readyHook) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareGroupHeartbeat) {
		return
	}
	if err == nil {
		h.m.coordinator.Store(meta.NodeID)
		h.m.hasCoordinator.Store(true)
	}
	h.set(err)
}

func (h readyHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.ShareGroupHeartbeat) && err != nil {
		h.set(err)
	}
}

func (h readyHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil && h.m.hasCoordinator.Load() && meta.NodeID == h.m.coordinator.Load() {
		h.set(err)
	}
}

func (h readyHook) set(err error) {
	sub := h.m.sub
	if sub.stop.Err() != nil {
		return
	}
	if r := h.m.refusal.Load(); r != nil && err == nil {
		err = *r // a heartbeat read, not necessarily accepted
	}
	p, err := h.m.phase(err)
	sub.host.SetPhase(h.m, sub.topic, p, err)
}

// fetchHook notes when a member's share fetches are sent and answered
// (member.sent and member.answered).
type fetchHook struct{ m *member }

var (
	_ kgo.HookBrokerWrite         = fetchHook{}
	_ kgo.HookBrokerRead          = fetchHook{}
	_ kgo.HookFetchRecordBuffered = fetchHook{}
)

func (h fetchHook) OnFetchRecordBuffered(r *kgo.Record) { h.m.buffer(r) }

func (h fetchHook) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareFetch) || err != nil {
		return
	}
	m := h.m
	m.sentMu.Lock()
	if m.sent == nil {
		m.sent, m.answered = make(map[int32]int64), make(map[int32]int64)
	}
	m.sent[meta.NodeID] = time.Now().UnixNano()
	m.sentMu.Unlock()
}

func (h fetchHook) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareFetch) {
		return
	}
	m := h.m
	if err == nil {
		m.noteFetchAnswered()
	}
	m.sentMu.Lock()
	if sent, ok := m.sent[meta.NodeID]; ok {
		m.answered[meta.NodeID] = sent
		delete(m.sent, meta.NodeID)
	}
	m.sentMu.Unlock()
}

// kgoLogger passes kgo's warnings and errors to the Watermill logger.
type kgoLogger struct{ l watermill.LoggerAdapter }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := watermill.LogFields{}
	for i := 0; i+1 < len(keyvals); i += 2 {
		fields[fmt.Sprint(keyvals[i])] = keyvals[i+1]
	}
	if level == kgo.LogLevelError {
		k.l.Error("kgo: "+msg, nil, fields)
		return
	}
	k.l.Info("kgo: "+msg, fields)
}
