// Package figures is the one list of the figures safeack's exporters read
// from a Subscriber (as plain values, see Views: it does not import the
// root package): the Prometheus collector (package metrics) and the
// OpenTelemetry instruments (package otel) both range over Gauges and
// Counters, so that a figure, its meaning and when it is absent are
// written once.
package figures

import "time"

// Gauge is a figure of one partition, read from its statistics S
// (Partition, of an owned partition's safeack.PartitionStats; Share, of a
// safeack.ShareStats).
type Gauge[S any] struct {
	// Prom is the Prometheus name, without namespace; OTel the
	// OpenTelemetry instrument name and Unit its UCUM unit.
	Prom, OTel, Unit string
	// Help describes the figure.
	Help string
	// Float: the figure is fractional (seconds); otherwise a whole number.
	Float bool
	// Value returns the figure, and false when the partition has none (the
	// series is then left out).
	Value func(s *S) (float64, bool)
}

// Counter is a monotonic figure of one topic-partition, read from its
// statistics S (Totals, of safeack.PartitionTotals, which never go down
// across reassignments; Share, of safeack.ShareStats, counted since the
// ShareSubscriber was made).
//
// Entries may share a name when they differ in Reason or Ack: in
// OpenTelemetry they are one instrument whose series carry the attribute
// safeack.skip.reason or safeack.share.ack; in Prometheus entries sharing
// a name are one metric with the label reason or ack, and entries with a
// name of their own carry neither.
type Counter[S any] struct {
	// Prom, OTel, Unit and Help are as for Gauge.
	Prom, OTel, Unit, Help string
	// OTelHelp, when not empty, describes the OpenTelemetry instrument in
	// Help's place: entries of one instrument with names of their own in
	// Prometheus.
	OTelHelp string
	// Reason and Ack, when not empty, tell the series of a shared name
	// apart (see Counter).
	Reason, Ack string
	Float       bool
	Value       func(s *S) float64
}

// Owned is the figure without partition labels: how many partitions the
// Subscriber owns (after Merged).
var Owned = Gauge[Partition]{
	Prom: "owned_partitions", OTel: "safeack.partitions.owned", Unit: "{partition}",
	Help: "Partitions the subscriber owns.",
}

func always(v float64) (float64, bool) { return v, true }

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Gauges are the per-partition gauges, in exposition order.
var Gauges = []Gauge[Partition]{
	{Prom: "safe_offset", OTel: "safeack.offset.safe", Unit: "{offset}",
		Help:  "Completed prefix: the offset a consumer may resume from without losing an unfinished record; what is marked for commit.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.SafeOffset)) }},
	{Prom: "marked_offset", OTel: "safeack.offset.marked", Unit: "{offset}",
		Help:  "Last offset handed to Sarama to commit.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.MarkedOffset)) }},
	{Prom: "confirmed_offset", OTel: "safeack.offset.committed", Unit: "{offset}",
		Help: "Offset the group coordinator holds as committed, as last read back after a commit interval. Absent until known.",
		Value: func(s *Partition) (float64, bool) {
			return float64(s.ConfirmedOffset), s.ConfirmedOffset >= 0
		}},
	{Prom: "high_water_mark", OTel: "safeack.offset.high_water_mark", Unit: "{offset}",
		Help:  "Partition high-water mark (the offset the next produced record gets) as last fetched. Absent until known.",
		Value: func(s *Partition) (float64, bool) { return float64(s.HighWaterMark), s.HighWaterMark >= 0 }},
	{Prom: "delivered_offset", OTel: "safeack.offset.delivered", Unit: "{offset}",
		Help:  "Position after the last record taken from Kafka.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.Delivered)) }},
	{Prom: "lag_records", OTel: "safeack.lag", Unit: "{message}",
		Help:  "Records between the high-water mark and the safe offset.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.Lag)) }},
	{Prom: "retained_records", OTel: "safeack.records.retained", Unit: "{message}",
		Help:  "Records held: running, waiting for their key, and completed but blocked behind an unfinished one.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.Retained)) }},
	{Prom: "blocked_records", OTel: "safeack.records.blocked", Unit: "{message}",
		Help:  "Completed records held behind an unfinished one.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.Blocked)) }},
	{Prom: "in_flight_messages", OTel: "safeack.messages.in_flight", Unit: "{message}",
		Help:  "Messages handed out and not yet acked or nacked.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.InFlight)) }},
	{Prom: "waiting_for_key_records", OTel: "safeack.records.waiting_for_key", Unit: "{message}",
		Help:  "Records waiting for a busy ordering key.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.WaitingForKey)) }},
	{Prom: "oldest_unfinished_offset", OTel: "safeack.offset.oldest_unfinished", Unit: "{offset}",
		Help:  "Offset of the oldest unfinished record, which holds the safe offset back. Absent when nothing is unfinished.",
		Value: func(s *Partition) (float64, bool) { return float64(s.OldestUnfinished), s.HasUnfinished }},
	{Prom: "oldest_unfinished_age_seconds", OTel: "safeack.oldest_unfinished.age", Unit: "s", Float: true,
		Help:  "How long the oldest unfinished record has been held since it was taken from Kafka; 0 when nothing is unfinished.",
		Value: func(s *Partition) (float64, bool) { return always(s.OldestUnfinishedAge.Seconds()) }},
	{Prom: "stuck", OTel: "safeack.stuck", Unit: "1",
		Help:  "1 when the partition waits on a record the unmarshaler rejected.",
		Value: func(s *Partition) (float64, bool) { return always(bool01(s.Stuck)) }},
	{Prom: "paused", OTel: "safeack.paused", Unit: "1",
		Help:  "1 when taking records waits for the completed tail to shrink (PauseAtTailUsage).",
		Value: func(s *Partition) (float64, bool) { return always(bool01(s.Paused)) }},
	{Prom: "tail_metadata_bytes", OTel: "safeack.tail.size", Unit: "By",
		Help:  "Size of the last completed tail written to the commit metadata.",
		Value: func(s *Partition) (float64, bool) { return always(float64(s.TailBytes)) }},
	{Prom: "tail_truncated", OTel: "safeack.tail.truncated", Unit: "1",
		Help:  "1 when the last completed tail did not fit the metadata budget whole.",
		Value: func(s *Partition) (float64, bool) { return always(bool01(s.TailTruncated)) }},
	{Prom: "assigned_timestamp_seconds", OTel: "safeack.assigned.time", Unit: "s", Float: true,
		Help: "Unix time at which this member got the partition.",
		Value: func(s *Partition) (float64, bool) {
			return float64(s.AssignedAt.UnixNano()) / 1e9, !s.AssignedAt.IsZero()
		}},
}

// UnclaimedGauges are the gauges of the partitions assigned to a
// Subscriber that it does not consume (safeack.Subscriber.Unclaimed): a
// series exists only while its partition is unclaimed.
var UnclaimedGauges = []Gauge[Unclaimed]{
	{Prom: "unclaimed_seconds", OTel: "safeack.unclaimed.time", Unit: "s", Float: true,
		Help: "How long a partition assigned to this member has not been consumed because it has no leader, or its leader does not answer: its claim cannot start, or it stopped fetching. Absent for partitions that are consumed.",
		Value: func(u *Unclaimed) (float64, bool) {
			return time.Since(u.Since).Seconds(), true
		}},
}

// Counters are the per-partition counters, in exposition order.
var Counters = []Counter[Totals]{
	{Prom: "assignments_total", OTel: "safeack.assignments", Unit: "{assignment}",
		Help:  "Assignments of the partition to this subscriber.",
		Value: func(t *Totals) float64 { return float64(t.Assignments) }},
	// messaging.client.consumed.messages is the messaging semantic
	// conventions' name for messages handed to the application.
	{Prom: "offered_records_total", OTel: "messaging.client.consumed.messages", Unit: "{message}",
		Help:  "Records taken from Kafka.",
		Value: func(t *Totals) float64 { return float64(t.Offered) }},
	{Prom: "completed_records_total", OTel: "safeack.records.completed", Unit: "{message}",
		Help:  "Records completed (acked, deferred and done, dead-lettered, or skipped as completed by a previous owner).",
		Value: func(t *Totals) float64 { return float64(t.Completed) }},
	{Prom: "redeliveries_total", OTel: "safeack.redeliveries", Unit: "{message}",
		Help:  "Messages nacked and redelivered.",
		Value: func(t *Totals) float64 { return float64(t.Redeliveries) }},
	{Prom: "unmarshal_failures_total", OTel: "safeack.unmarshal_failures", Unit: "{message}",
		Help:  "Unmarshal attempts the unmarshaler rejected.",
		Value: func(t *Totals) float64 { return float64(t.UnmarshalFailures) }},
	{Prom: "skipped_records_total", OTel: "safeack.records.skipped", Unit: "{message}", Reason: "tail",
		Help:  SkippedHelp,
		Value: func(t *Totals) float64 { return float64(t.SkippedTail) }},
	{Prom: "skipped_records_total", OTel: "safeack.records.skipped", Unit: "{message}", Reason: "revoked",
		Help:  SkippedHelp,
		Value: func(t *Totals) float64 { return float64(t.SkippedRevoked) }},
	{Prom: "dead_lettered_records_total", OTel: "safeack.records.dead_lettered", Unit: "{message}",
		Help:  "Records published to a dead-letter topic by safeack.PoisonQueue (counted in completed_records_total too).",
		Value: func(t *Totals) float64 { return float64(t.DeadLettered) }},
	{Prom: "ignored_metadata_total", OTel: "safeack.metadata.ignored", Unit: "{commit}",
		Help:  "Commit metadata found and not trusted (another client's, corrupt, or relative to another offset).",
		Value: func(t *Totals) float64 { return float64(t.IgnoredMetadata) }},
	{Prom: "log_truncations_total", OTel: "safeack.log.truncations", Unit: "{start}",
		Help:  "Starts at which the log was found truncated under the group's commit (unclean leader election); the start moved back to the divergence and the completed tail was handled again.",
		Value: func(t *Totals) float64 { return float64(t.LogTruncations) }},
	{Prom: "deferred_completions_total", OTel: "safeack.completions.deferred", Unit: "{message}",
		Help:  "Completions deferred with safeack.Defer.",
		Value: func(t *Totals) float64 { return float64(t.Deferred) }},
	{Prom: "paused_seconds_total", OTel: "safeack.paused.time", Unit: "s", Float: true,
		Help:  "Time spent paused for the completed tail to shrink.",
		Value: func(t *Totals) float64 { return t.PausedFor.Seconds() }},
}

// SkippedHelp describes the skipped-records counter, whose two series
// differ in reason.
const SkippedHelp = "Records whose handler was not run: reason=\"tail\" when the commit metadata said a previous owner completed them, reason=\"revoked\" when their assignment had ended."

// Merged folds the Stats entries of one topic-partition into one. Two
// subscriptions of the Subscriber to one topic without a consumer group
// (two router handlers on it) each own every partition, and an exporter
// must not report two series with the same labels (a Prometheus registry
// fails the whole scrape). Counts add up; positions, ages and flags are
// those of the subscription furthest behind.
func Merged(stats []Partition) []Partition {
	type topicPartition struct {
		topic     string
		partition int32
	}
	out := make([]Partition, 0, len(stats))
	at := make(map[topicPartition]int, len(stats))
	for _, s := range stats {
		tp := topicPartition{s.Topic, s.Partition}
		i, seen := at[tp]
		if !seen {
			at[tp] = len(out)
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
