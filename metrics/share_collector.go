package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
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
// safeack_share_given_back_records_total (released without being handed
// out: no handler was about to take them),
// safeack_share_skipped_closing_records_total, safeack_share_ack_errors_total (partition acknowledgements the
// broker refused) and the gauge safeack_share_max_delivery_count. To
// register a Collector and a ShareCollector in one registry, tell them apart
// with WithConstLabels. The figures are those package otel's
// RegisterShareMetrics exports, from the same list.
type ShareCollector struct {
	sub      *safeack.ShareSubscriber
	gauges   gaugeDescs[figures.Share]
	counters counterDescs[figures.Share]
}

var _ prometheus.Collector = (*ShareCollector)(nil)

// NewShareCollector returns a ShareCollector of sub's statistics.
func NewShareCollector(sub *safeack.ShareSubscriber, opts ...Option) *ShareCollector {
	o := options{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt(&o)
	}
	return &ShareCollector{
		sub:      sub,
		gauges:   newGaugeDescs(o.desc, figures.ShareGauges),
		counters: newCounterDescs(o.desc, figures.ShareCounters),
	}
}

// Describe sends the descriptors of every metric the ShareCollector exports.
func (c *ShareCollector) Describe(ch chan<- *prometheus.Desc) {
	c.gauges.describe(ch)
	c.counters.describe(ch)
}

// Collect reads the ShareSubscriber's statistics and sends them as metrics.
func (c *ShareCollector) Collect(ch chan<- prometheus.Metric) {
	stats := figures.Views[figures.Share](c.sub.Stats())
	for i := range stats {
		s := &stats[i]
		c.gauges.collect(ch, s, s.Topic, s.Partition)
		c.counters.collect(ch, s, s.Topic, s.Partition)
	}
}
