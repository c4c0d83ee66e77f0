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
// labels.
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

	owned *prometheus.Desc

	safe, marked, confirmed, hwm, delivered         *prometheus.Desc
	lag, retained, blocked, inFlight, waitingForKey *prometheus.Desc
	oldestOffset, oldestAge                         *prometheus.Desc
	stuck, paused, tailBytes, tailTruncated         *prometheus.Desc
	assignedAt                                      *prometheus.Desc

	assignments, offered, completed, redeliveries *prometheus.Desc
	unmarshalFailures, skipped, ignoredMetadata   *prometheus.Desc
	logTruncations                                *prometheus.Desc
	deferred, pausedSeconds                       *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector of sub's statistics.
func NewCollector(sub *safeack.Subscriber, opts ...Option) *Collector {
	o := options{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	tp := []string{"topic", "partition"}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(o.namespace, "", name), help, labels, o.constLabels)
	}
	return &Collector{
		sub: sub,

		owned: desc("owned_partitions", "Partitions the subscriber owns."),

		safe:          desc("safe_offset", "Completed prefix: the offset a consumer may resume from without losing an unfinished record; what is marked for commit.", tp...),
		marked:        desc("marked_offset", "Last offset handed to Sarama to commit.", tp...),
		confirmed:     desc("confirmed_offset", "Offset the group coordinator holds as committed, as last read back after a commit interval. Absent until known.", tp...),
		hwm:           desc("high_water_mark", "Partition high-water mark (the offset the next produced record gets) as last fetched. Absent until known.", tp...),
		delivered:     desc("delivered_offset", "Position after the last record taken from Kafka.", tp...),
		lag:           desc("lag_records", "Records between the high-water mark and the safe offset.", tp...),
		retained:      desc("retained_records", "Records held: running, waiting for their key, and completed but blocked behind an unfinished one.", tp...),
		blocked:       desc("blocked_records", "Completed records held behind an unfinished one.", tp...),
		inFlight:      desc("in_flight_messages", "Messages handed out and not yet acked or nacked.", tp...),
		waitingForKey: desc("waiting_for_key_records", "Records waiting for a busy ordering key.", tp...),
		oldestOffset:  desc("oldest_unfinished_offset", "Offset of the oldest unfinished record, which holds the safe offset back. Absent when nothing is unfinished.", tp...),
		oldestAge:     desc("oldest_unfinished_age_seconds", "How long the oldest unfinished record has been held since it was taken from Kafka; 0 when nothing is unfinished.", tp...),
		stuck:         desc("stuck", "1 when the partition waits on a record the unmarshaler rejected.", tp...),
		paused:        desc("paused", "1 when taking records waits for the completed tail to shrink (PauseAtTailUsage).", tp...),
		tailBytes:     desc("tail_metadata_bytes", "Size of the last completed tail written to the commit metadata.", tp...),
		tailTruncated: desc("tail_truncated", "1 when the last completed tail did not fit the metadata budget whole.", tp...),
		assignedAt:    desc("assigned_timestamp_seconds", "Unix time at which this member got the partition.", tp...),

		assignments:       desc("assignments_total", "Assignments of the partition to this subscriber.", tp...),
		offered:           desc("offered_records_total", "Records taken from Kafka.", tp...),
		completed:         desc("completed_records_total", "Records completed (acked, deferred and done, dead-lettered, or skipped as completed by a previous owner).", tp...),
		redeliveries:      desc("redeliveries_total", "Messages nacked and redelivered.", tp...),
		unmarshalFailures: desc("unmarshal_failures_total", "Unmarshal attempts the unmarshaler rejected.", tp...),
		skipped:           desc("skipped_records_total", "Records whose handler was not run: reason=\"tail\" when the commit metadata said a previous owner completed them, reason=\"revoked\" when their assignment had ended.", "topic", "partition", "reason"),
		ignoredMetadata:   desc("ignored_metadata_total", "Commit metadata found and not trusted (another client's, corrupt, or relative to another offset).", tp...),
		logTruncations:    desc("log_truncations_total", "Starts at which the log was found truncated under the group's commit (unclean leader election); the start moved back to the divergence and the completed tail was handled again.", tp...),
		deferred:          desc("deferred_completions_total", "Completions deferred with safeack.Defer.", tp...),
		pausedSeconds:     desc("paused_seconds_total", "Time spent paused for the completed tail to shrink.", tp...),
	}
}

// Describe sends the descriptors of every metric the Collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.owned,
		c.safe, c.marked, c.confirmed, c.hwm, c.delivered,
		c.lag, c.retained, c.blocked, c.inFlight, c.waitingForKey,
		c.oldestOffset, c.oldestAge,
		c.stuck, c.paused, c.tailBytes, c.tailTruncated,
		c.assignedAt,
		c.assignments, c.offered, c.completed, c.redeliveries,
		c.unmarshalFailures, c.skipped, c.ignoredMetadata, c.logTruncations,
		c.deferred, c.pausedSeconds,
	} {
		ch <- d
	}
}

// Collect reads the Subscriber's statistics and sends them as metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	stats := merged(c.sub.Stats())
	ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, float64(len(stats)))
	for _, s := range stats {
		lv := []string{s.Topic, strconv.FormatInt(int64(s.Partition), 10)}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		gauge(c.safe, float64(s.SafeOffset))
		gauge(c.marked, float64(s.MarkedOffset))
		if s.ConfirmedOffset >= 0 {
			gauge(c.confirmed, float64(s.ConfirmedOffset))
		}
		if s.HighWaterMark >= 0 {
			gauge(c.hwm, float64(s.HighWaterMark))
		}
		gauge(c.delivered, float64(s.Delivered))
		gauge(c.lag, float64(s.Lag))
		gauge(c.retained, float64(s.Retained))
		gauge(c.blocked, float64(s.Blocked))
		gauge(c.inFlight, float64(s.InFlight))
		gauge(c.waitingForKey, float64(s.WaitingForKey))
		if s.HasUnfinished {
			gauge(c.oldestOffset, float64(s.OldestUnfinished))
		}
		gauge(c.oldestAge, s.OldestUnfinishedAge.Seconds())
		gauge(c.stuck, bool01(s.Stuck))
		gauge(c.paused, bool01(s.Paused))
		gauge(c.tailBytes, float64(s.TailBytes))
		gauge(c.tailTruncated, bool01(s.TailTruncated))
		if !s.AssignedAt.IsZero() {
			gauge(c.assignedAt, float64(s.AssignedAt.UnixNano())/1e9)
		}
	}

	for _, t := range c.sub.Totals() {
		lv := []string{t.Topic, strconv.FormatInt(int64(t.Partition), 10)}
		counter := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append(lv, extra...)...)
		}
		counter(c.assignments, float64(t.Assignments))
		counter(c.offered, float64(t.Offered))
		counter(c.completed, float64(t.Completed))
		counter(c.redeliveries, float64(t.Redeliveries))
		counter(c.unmarshalFailures, float64(t.UnmarshalFailures))
		counter(c.skipped, float64(t.SkippedTail), "tail")
		counter(c.skipped, float64(t.SkippedRevoked), "revoked")
		counter(c.ignoredMetadata, float64(t.IgnoredMetadata))
		counter(c.logTruncations, float64(t.LogTruncations))
		counter(c.deferred, float64(t.Deferred))
		counter(c.pausedSeconds, t.PausedFor.Seconds())
	}
}

// merged folds the Stats entries of one topic-partition into one. Two
// subscriptions of the Subscriber to one topic without a consumer group
// (two router handlers on it) each own every partition, and a registry
// refuses two series with the same labels: the whole scrape would fail.
// Counts add up; positions, ages and flags are those of the subscription
// furthest behind.
func merged(stats []safeack.PartitionStats) []safeack.PartitionStats {
	out := make([]safeack.PartitionStats, 0, len(stats))
	at := make(map[safeack.TopicPartition]int, len(stats))
	for _, s := range stats {
		i, seen := at[s.TopicPartition]
		if !seen {
			at[s.TopicPartition] = len(out)
			out = append(out, s)
			continue
		}
		m := &out[i]
		m.SafeOffset = min(m.SafeOffset, s.SafeOffset)
		m.MarkedOffset = min(m.MarkedOffset, s.MarkedOffset)
		if s.ConfirmedOffset >= 0 && (m.ConfirmedOffset < 0 || s.ConfirmedOffset < m.ConfirmedOffset) {
			m.ConfirmedOffset = s.ConfirmedOffset
		}
		m.HighWaterMark = max(m.HighWaterMark, s.HighWaterMark)
		m.Lag = max(m.Lag, s.Lag)
		m.Delivered = min(m.Delivered, s.Delivered)
		m.Retained += s.Retained
		m.Blocked += s.Blocked
		m.InFlight += s.InFlight
		m.WaitingForKey += s.WaitingForKey
		if s.HasUnfinished && (!m.HasUnfinished || s.OldestUnfinished < m.OldestUnfinished) {
			m.OldestUnfinished, m.HasUnfinished = s.OldestUnfinished, true
		}
		m.OldestUnfinishedAge = max(m.OldestUnfinishedAge, s.OldestUnfinishedAge)
		m.Stuck = m.Stuck || s.Stuck
		m.Paused = m.Paused || s.Paused
		m.TailBytes = max(m.TailBytes, s.TailBytes)
		m.TailTruncated = m.TailTruncated || s.TailTruncated
		if !s.AssignedAt.IsZero() && (m.AssignedAt.IsZero() || s.AssignedAt.Before(m.AssignedAt)) {
			m.AssignedAt = s.AssignedAt
		}
	}
	return out
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
