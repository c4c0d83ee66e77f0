package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safeack/safeack"
)

// ShareCollector is a prometheus.Collector over one ShareSubscriber. Every
// scrape reads (*safeack.ShareSubscriber).Stats. All series carry the
// labels topic and partition, for every partition the subscriber received
// records of.
//
// Where a figure means what it means for a Subscriber, the name is the
// Collector's: safeack_in_flight_messages, safeack_oldest_unfinished_offset
// and safeack_oldest_unfinished_age_seconds (the oldest message handed out
// and not answered), safeack_offered_records_total (records received,
// redeliveries included), safeack_unmarshal_failures_total and
// safeack_deferred_completions_total. The rest are the share group's own:
// safeack_share_accepted_records_total, safeack_share_released_records_total,
// safeack_share_rejected_records_total,
// safeack_share_dead_lettered_records_total,
// safeack_share_released_at_close_records_total,
// safeack_share_redelivered_records_total (received with a delivery count
// above one), safeack_share_lock_renewals_total,
// safeack_share_skipped_closing_records_total, safeack_share_ack_errors_total (partition acknowledgements the
// broker refused) and the gauge safeack_share_max_delivery_count. To
// register a Collector and a ShareCollector in one registry, tell them apart
// with WithConstLabels.
type ShareCollector struct {
	sub *safeack.ShareSubscriber

	inFlight, oldestOffset, oldestAge, maxDeliveryCount *prometheus.Desc

	offered, unmarshalFailures, deferred             *prometheus.Desc
	accepted, released, rejected, deadLettered       *prometheus.Desc
	releasedAtClose, redelivered, ackErrors, skipped *prometheus.Desc
	renewals                                         *prometheus.Desc
}

var _ prometheus.Collector = (*ShareCollector)(nil)

// NewShareCollector returns a ShareCollector of sub's statistics.
func NewShareCollector(sub *safeack.ShareSubscriber, opts ...Option) *ShareCollector {
	o := options{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	tp := []string{"topic", "partition"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(o.namespace, "", name), help, tp, o.constLabels)
	}
	return &ShareCollector{
		sub: sub,

		inFlight:         desc("in_flight_messages", "Messages handed out and not yet answered (a deferred completion counts until resolved)."),
		oldestOffset:     desc("oldest_unfinished_offset", "Offset of the message handed out longest ago and not answered. Absent when none is in flight."),
		oldestAge:        desc("oldest_unfinished_age_seconds", "How long ago the oldest unanswered message was handed out; 0 when none is in flight."),
		maxDeliveryCount: desc("share_max_delivery_count", "Highest share group delivery count seen."),

		offered:           desc("offered_records_total", "Records received from the share group, redeliveries included."),
		unmarshalFailures: desc("unmarshal_failures_total", "Records the unmarshaler rejected."),
		deferred:          desc("deferred_completions_total", "Completions deferred with safeack.Defer."),
		accepted:          desc("share_accepted_records_total", "Records acknowledged ACCEPT (acked, dead-lettered, or taken by OnUnmarshalError)."),
		released:          desc("share_released_records_total", "Records acknowledged RELEASE (nacked, or unanswered at Close): delivered again."),
		rejected:          desc("share_rejected_records_total", "Records acknowledged REJECT (RejectPoison, past MaxDeliveries, or unmarshal failures): archived, never delivered again."),
		deadLettered:      desc("share_dead_lettered_records_total", "Records past MaxDeliveries handed to DeadLetter and accepted."),
		releasedAtClose:   desc("share_released_at_close_records_total", "Records released because the subscription ended before they were answered."),
		redelivered:       desc("share_redelivered_records_total", "Records received with a delivery count above one."),
		ackErrors:         desc("share_ack_errors_total", "Partition acknowledgements the broker refused; their records are delivered again."),
		renewals:          desc("share_lock_renewals_total", "Acquisition lock renewals of records whose answer took more than half their lock."),
		skipped:           desc("share_skipped_closing_records_total", "Messages whose handler SkipRevoked did not run because the subscriber was closing."),
	}
}

// Describe sends the descriptors of every metric the ShareCollector exports.
func (c *ShareCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.inFlight, c.oldestOffset, c.oldestAge, c.maxDeliveryCount,
		c.offered, c.unmarshalFailures, c.deferred,
		c.accepted, c.released, c.rejected, c.deadLettered,
		c.releasedAtClose, c.redelivered, c.ackErrors, c.skipped, c.renewals,
	} {
		ch <- d
	}
}

// Collect reads the ShareSubscriber's statistics and sends them as metrics.
func (c *ShareCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.sub.Stats() {
		lv := []string{s.Topic, strconv.FormatInt(int64(s.Partition), 10)}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
		}
		gauge(c.inFlight, float64(s.InFlight))
		if s.InFlight > 0 {
			gauge(c.oldestOffset, float64(s.OldestInFlight))
		}
		gauge(c.oldestAge, s.OldestInFlightAge.Seconds())
		gauge(c.maxDeliveryCount, float64(s.MaxDeliveryCount))
		counter(c.offered, s.Received)
		counter(c.unmarshalFailures, s.UnmarshalFailures)
		counter(c.deferred, s.Deferred)
		counter(c.accepted, s.Accepted)
		counter(c.released, s.Released)
		counter(c.rejected, s.Rejected)
		counter(c.deadLettered, s.DeadLettered)
		counter(c.releasedAtClose, s.ReleasedAtClose)
		counter(c.redelivered, s.Redelivered)
		counter(c.ackErrors, s.AckErrors)
		counter(c.skipped, s.SkippedClosing)
		counter(c.renewals, s.LockRenewals)
	}
}
