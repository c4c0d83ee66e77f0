// Package metrics exports a safeack Subscriber's per-partition statistics
// to Prometheus.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewCollector(sub))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Every scrape reads (*safeack.Subscriber).Stats and Totals; nothing is
// sampled in between, so the numbers are those of the moment of the scrape.
// All series carry the labels topic and partition.
//
// Gauges describe the partitions the Subscriber owns at the scrape and
// disappear with the assignment: safeack_safe_offset (the completed prefix,
// what is marked for commit), safeack_marked_offset,
// safeack_confirmed_offset (what the group coordinator holds, absent until
// read back), safeack_high_water_mark (absent until known),
// safeack_delivered_offset, safeack_lag_records, safeack_retained_records,
// safeack_blocked_records (completed, held behind an unfinished record),
// safeack_in_flight_messages, safeack_waiting_for_key_records,
// safeack_oldest_unfinished_offset (absent when nothing is unfinished),
// safeack_oldest_unfinished_age_seconds, safeack_stuck, safeack_paused,
// safeack_tail_metadata_bytes, safeack_tail_truncated and
// safeack_assigned_timestamp_seconds; safeack_owned_partitions has no
// labels. safeack_unclaimed_seconds exists only for a partition assigned
// to the Subscriber that it does not consume, because it has no leader or
// its leader does not answer: its claim cannot start, or it stopped
// fetching (see (*safeack.Subscriber).Unclaimed): how long since it was
// last consumed. Alert on its presence.
//
// Counters are monotonic. safeack.PartitionStats counts per assignment and
// restarts from zero when a partition is reassigned, so the counters come
// from (*safeack.Subscriber).Totals instead, which sums every assignment of a
// topic-partition the Subscriber has had. They are therefore exported for
// every partition the Subscriber has ever owned, not only the current ones,
// and reset only when the Subscriber (the process) is replaced, which
// Prometheus' rate and increase handle: safeack_assignments_total,
// safeack_offered_records_total, safeack_completed_records_total,
// safeack_redeliveries_total, safeack_unmarshal_failures_total,
// safeack_skipped_records_total{reason="tail"|"revoked"},
// safeack_ignored_metadata_total, safeack_deferred_completions_total and
// safeack_paused_seconds_total.
//
// "Safe" and "confirmed" are separate on purpose: safeack_safe_offset is what
// this member may commit, safeack_confirmed_offset what the broker says it
// holds. A safe offset that stops moving while the high-water mark grows is a
// slow or stuck head (see safeack_oldest_unfinished_age_seconds); a
// confirmed offset that lags the safe one points at commits failing.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
)

// DefaultNamespace prefixes every metric name.
const DefaultNamespace = "safeack"

// Option configures a Collector.
type Option func(*options)

type options struct {
	namespace   string
	constLabels prometheus.Labels
}

// WithNamespace replaces the metric name prefix (default "safeack"). An
// empty namespace leaves the names unprefixed.
func WithNamespace(namespace string) Option {
	return func(o *options) { o.namespace = namespace }
}

// WithConstLabels adds labels with fixed values to every series, for
// example {"group": "orders"} to tell apart several Subscribers registered
// in one registry (their series would collide otherwise). The labels topic,
// partition and reason are taken.
func WithConstLabels(labels prometheus.Labels) Option {
	return func(o *options) {
		if o.constLabels == nil {
			o.constLabels = prometheus.Labels{}
		}
		for k, v := range labels {
			o.constLabels[k] = v
		}
	}
}

// Collector is a prometheus.Collector over one Subscriber. Register it once
// per registry; it is safe for concurrent scrapes.
type Collector struct {
	sub *safeack.Subscriber

	owned     *prometheus.Desc
	gauges    gaugeDescs[figures.Partition]
	unclaimed gaugeDescs[figures.Unclaimed]
	counters  counterDescs[figures.Totals]
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector of sub's statistics.
func NewCollector(sub *safeack.Subscriber, opts ...Option) *Collector {
	o := options{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	desc := o.desc
	return &Collector{
		sub:       sub,
		owned:     desc(figures.Owned.Prom, figures.Owned.Help),
		gauges:    newGaugeDescs(desc, figures.Gauges),
		unclaimed: newGaugeDescs(desc, figures.UnclaimedGauges),
		counters:  newCounterDescs(desc, figures.Counters),
	}
}

// Describe sends the descriptors of every metric the Collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.owned
	c.gauges.describe(ch)
	c.unclaimed.describe(ch)
	c.counters.describe(ch)
}

// Collect reads the Subscriber's statistics and sends them as metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	stats := figures.Merged(figures.Views[figures.Partition](c.sub.Stats()))
	ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, float64(len(stats)))
	for i := range stats {
		s := &stats[i]
		c.gauges.collect(ch, s, s.Topic, s.Partition)
	}
	for _, u := range figures.Views[figures.Unclaimed](c.sub.Unclaimed()) {
		c.unclaimed.collect(ch, &u, u.Topic, u.Partition)
	}
	totals := figures.Views[figures.Totals](c.sub.Totals())
	for i := range totals {
		t := &totals[i]
		c.counters.collect(ch, t, t.Topic, t.Partition)
	}
}

// desc describes a metric of the options' namespace and constant labels.
func (o options) desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(o.namespace, "", name), help, labels, o.constLabels)
}

// gaugeDescs are the Prometheus gauges of a list of figures, one each,
// labelled topic and partition.
type gaugeDescs[S any] struct {
	figs  []figures.Gauge[S]
	descs []*prometheus.Desc
}

func newGaugeDescs[S any](desc func(name, help string, labels ...string) *prometheus.Desc, figs []figures.Gauge[S]) gaugeDescs[S] {
	g := gaugeDescs[S]{figs: figs}
	for _, f := range figs {
		g.descs = append(g.descs, desc(f.Prom, f.Help, "topic", "partition"))
	}
	return g
}

func (g gaugeDescs[S]) describe(ch chan<- *prometheus.Desc) {
	for _, d := range g.descs {
		ch <- d
	}
}

// collect sends the figures s has, of topic's partition p.
func (g gaugeDescs[S]) collect(ch chan<- prometheus.Metric, s *S, topic string, p int32) {
	part := strconv.FormatInt(int64(p), 10)
	for i, f := range g.figs {
		if v, ok := f.Value(s); ok {
			ch <- prometheus.MustNewConstMetric(g.descs[i], prometheus.GaugeValue, v, topic, part)
		}
	}
}

// counterDescs are the Prometheus counters of a list of figures, labelled
// topic and partition: entries of one name are one metric, told apart by
// the label reason or ack (see figures.Counter).
type counterDescs[S any] struct {
	figs   []figures.Counter[S]
	descs  []*prometheus.Desc
	shared []bool // the entry's name is shared: it carries its reason or ack label
}

func newCounterDescs[S any](desc func(name, help string, labels ...string) *prometheus.Desc, figs []figures.Counter[S]) counterDescs[S] {
	c := counterDescs[S]{figs: figs}
	count := map[string]int{}
	for _, f := range figs {
		count[f.Prom]++
	}
	byName := map[string]*prometheus.Desc{}
	for _, f := range figs {
		shared := count[f.Prom] > 1
		d := byName[f.Prom]
		if d == nil {
			labels := []string{"topic", "partition"}
			switch {
			case shared && f.Reason != "":
				labels = append(labels, "reason")
			case shared && f.Ack != "":
				labels = append(labels, "ack")
			}
			d = desc(f.Prom, f.Help, labels...)
			byName[f.Prom] = d
		}
		c.descs = append(c.descs, d)
		c.shared = append(c.shared, shared)
	}
	return c
}

func (c counterDescs[S]) describe(ch chan<- *prometheus.Desc) {
	seen := map[*prometheus.Desc]bool{}
	for _, d := range c.descs {
		if !seen[d] {
			seen[d] = true
			ch <- d
		}
	}
}

// collect sends every figure of s, of topic's partition p.
func (c counterDescs[S]) collect(ch chan<- prometheus.Metric, s *S, topic string, p int32) {
	lv := []string{topic, strconv.FormatInt(int64(p), 10)}
	for i, f := range c.figs {
		labels := lv
		if c.shared[i] {
			labels = append(lv[:2:2], f.Reason+f.Ack) // one of them is set
		}
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.CounterValue, f.Value(s), labels...)
	}
}
