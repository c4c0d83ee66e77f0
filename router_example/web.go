package main

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/safeack/safeack"
)

//go:embed static
var staticFiles embed.FS

// maxWindowEntries bounds the records per partition the live page gets
// drawn: a cheap read under the partition's lock, a few times a second.
const maxWindowEntries = 4000

func (a *app) httpHandler() http.Handler {
	mux := http.NewServeMux()
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	mux.Handle("GET /", noCache(http.FileServerFS(static)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/frontier", a.serveFrontier)
	return mux
}

func noCache(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// frontierView is the JSON of /api/frontier: what the live page draws.
type frontierView struct {
	Time           time.Time       `json:"time"`
	UptimeSeconds  float64         `json:"uptime_s"`
	Topic          string          `json:"topic"`
	Group          string          `json:"group"`
	Ordering       string          `json:"ordering"`
	Embedded       bool            `json:"embedded"`
	Brokers        []string        `json:"brokers"`
	CommitInterval float64         `json:"commit_interval_s"`
	SlowLatency    float64         `json:"slow_latency_s"`
	ProducedRate   float64         `json:"produced_per_s"`
	HandledRate    float64         `json:"handled_per_s"`
	Produced       int64           `json:"produced"`
	Handled        int64           `json:"handled"`
	Nacked         int64           `json:"nacked"`
	Skipped        int64           `json:"skipped"`
	DeadLettered   int64           `json:"dead_lettered"`
	FailedAttempts int64           `json:"failed_attempts"`
	SlowRuns       int64           `json:"slow_runs"`
	Partitions     []partitionView `json:"partitions"`
}

// partitionView is one partition: offsets, counts and the retained window.
type partitionView struct {
	Partition int32 `json:"partition"`
	// Committed is what the group coordinator confirmed (-1: nothing
	// yet); Safe the completed prefix; Delivered the position after the
	// last record taken; HWM the end of the log (-1: unknown). Safe,
	// Delivered, Retained, Blocked, Unfinished and Runs are one snapshot;
	// the other fields are read just before it.
	Committed int64 `json:"committed"`
	Marked    int64 `json:"marked"`
	Safe      int64 `json:"safe"`
	Delivered int64 `json:"delivered"`
	HWM       int64 `json:"hwm"`
	Lag       int64 `json:"lag"`

	Retained      int `json:"retained"`
	Blocked       int `json:"blocked"`
	Unfinished    int `json:"unfinished"`
	InFlight      int `json:"in_flight"`
	WaitingForKey int `json:"waiting_for_key"`
	// OldestUnfinished is the record holding the prefix back (-1: none),
	// held for OldestAge seconds.
	OldestUnfinished int64   `json:"oldest_unfinished"`
	OldestAge        float64 `json:"oldest_age_s"`
	Paused           bool    `json:"paused"`
	Stuck            bool    `json:"stuck"`

	Completed    uint64 `json:"completed"`
	Redeliveries uint64 `json:"redeliveries"`

	// Runs are the retained records from the oldest unfinished one on, as
	// [from, to, records, done] with done 1 for completed-but-blocked
	// runs and 0 for unfinished ones (see safeack.WindowRun).
	Runs      [][4]int64 `json:"runs"`
	Truncated bool       `json:"truncated"`
}

func (a *app) frontier() frontierView {
	produced, handled := a.rates.get()
	v := frontierView{
		Time:           time.Now(),
		UptimeSeconds:  time.Since(a.started).Seconds(),
		Topic:          a.cfg.Topic,
		Group:          a.cfg.Group,
		Ordering:       a.cfg.Ordering.String(),
		Embedded:       len(a.cfg.Brokers) == 0,
		Brokers:        a.brokers,
		CommitInterval: a.sub.CommitInterval().Seconds(), // the period that runs, as the subscriber resolved it
		SlowLatency:    a.cfg.SlowLatency.Seconds(),
		ProducedRate:   produced,
		HandledRate:    handled,
		Produced:       a.produced.Load(),
		Handled:        a.acked.Load(),
		Nacked:         a.nacked.Load(),
		Skipped:        a.skipped.Load(),
		DeadLettered:   a.deadLettered.Load(),
		FailedAttempts: a.failedAttempts.Load(),
		SlowRuns:       a.slowRuns.Load(),
		Partitions:     []partitionView{},
	}
	// Stats first, then the windows: a window's safe offset is then never
	// behind the committed offset read with the stats.
	stats := a.sub.Stats()
	windows := make(map[safeack.TopicPartition]safeack.PartitionWindow)
	for _, w := range a.sub.Windows(maxWindowEntries) {
		windows[w.TopicPartition] = w
	}
	for _, s := range stats {
		w, ok := windows[s.TopicPartition]
		if !ok || s.Topic != a.cfg.Topic {
			continue // assigned or revoked between the two reads
		}
		p := partitionView{
			Partition:        s.Partition,
			Committed:        s.ConfirmedOffset,
			Marked:           s.MarkedOffset,
			Safe:             w.SafeOffset,
			Delivered:        w.Delivered,
			HWM:              s.HighWaterMark,
			Lag:              s.Lag,
			Retained:         w.Retained,
			Blocked:          w.Blocked,
			Unfinished:       w.Retained - w.Blocked,
			InFlight:         s.InFlight,
			WaitingForKey:    s.WaitingForKey,
			OldestUnfinished: -1,
			OldestAge:        s.OldestUnfinishedAge.Seconds(),
			Paused:           s.Paused,
			Stuck:            s.Stuck,
			Completed:        s.Completed,
			Redeliveries:     s.Redeliveries,
			Runs:             make([][4]int64, 0, len(w.Runs)),
			Truncated:        w.Truncated,
		}
		if s.HasUnfinished {
			p.OldestUnfinished = s.OldestUnfinished
		}
		for _, r := range w.Runs {
			done := int64(0)
			if r.Done {
				done = 1
			}
			p.Runs = append(p.Runs, [4]int64{r.From, r.To, int64(r.Records), done})
		}
		v.Partitions = append(v.Partitions, p)
	}
	return v
}

func (a *app) serveFrontier(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(a.frontier())
}

// rateMeter keeps the records/s of the last second.
type rateMeter struct {
	mu                    sync.Mutex
	produced, handled     float64
	lastProd, lastHandled int64
	lastAt                time.Time
}

func (m *rateMeter) sample(produced, handled int64, now time.Time) (float64, float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.lastAt.IsZero() {
		dt := now.Sub(m.lastAt).Seconds()
		if dt > 0 {
			m.produced = float64(produced-m.lastProd) / dt
			m.handled = float64(handled-m.lastHandled) / dt
		}
	}
	m.lastProd, m.lastHandled, m.lastAt = produced, handled, now
	return m.produced, m.handled
}

func (m *rateMeter) get() (float64, float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.produced, m.handled
}

// progress samples the rates every second and prints one line:
//
//	12s  in 301/s  done 299/s  dlq 3  in flight 41 | p0 3412/3400  p1 3398/3390 b37 ...
//
// per partition: the safe offset (completed prefix) / the committed offset
// confirmed by the broker, and bN when N completed records are blocked
// behind an unfinished one.
func (a *app) progress(stop <-chan struct{}) {
	a.printf("progress: per partition p<n> <safe offset>/<committed offset>, b<records completed but blocked behind a slower one>\n")
	a.rates.sample(a.produced.Load(), a.acked.Load(), time.Now())
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			prod, done := a.rates.sample(a.produced.Load(), a.acked.Load(), now)
			a.printf("%s\n", a.progressLine(now, prod, done))
		}
	}
}

func (a *app) progressLine(now time.Time, prod, done float64) string {
	var b strings.Builder
	inFlight := 0
	stats := a.sub.Stats()
	for _, s := range stats {
		inFlight += s.InFlight
	}
	fmt.Fprintf(&b, "%5.0fs  in %4.0f/s  done %4.0f/s  dlq %d  in flight %3d |",
		now.Sub(a.started).Seconds(), prod, done, a.deadLettered.Load(), inFlight)
	if len(stats) == 0 {
		b.WriteString(" (waiting for a partition assignment)")
	}
	for _, s := range stats {
		committed := "-"
		if s.ConfirmedOffset >= 0 {
			committed = fmt.Sprint(s.ConfirmedOffset)
		}
		fmt.Fprintf(&b, " p%d %d/%s", s.Partition, s.SafeOffset, committed)
		if s.Blocked > 0 {
			fmt.Fprintf(&b, " b%d", s.Blocked)
		}
	}
	return b.String()
}
