package figures

// ShareGauges are a ShareSubscriber's per-partition gauges, in exposition
// order. Where a figure means what it means for a Subscriber, its names
// are the Subscriber's.
var ShareGauges = []Gauge[Share]{
	{Prom: "in_flight_messages", OTel: "safeack.messages.in_flight", Unit: "{message}",
		Help:  "Messages handed out and not yet answered (a deferred completion counts until resolved).",
		Value: func(s *Share) (float64, bool) { return always(float64(s.InFlight)) }},
	{Prom: "oldest_unfinished_offset", OTel: "safeack.offset.oldest_unfinished", Unit: "{offset}",
		Help:  "Offset of the message handed out longest ago and not answered. Absent when none is in flight.",
		Value: func(s *Share) (float64, bool) { return float64(s.OldestInFlight), s.InFlight > 0 }},
	{Prom: "oldest_unfinished_age_seconds", OTel: "safeack.oldest_unfinished.age", Unit: "s", Float: true,
		Help:  "How long ago the oldest unanswered message was handed out; 0 when none is in flight.",
		Value: func(s *Share) (float64, bool) { return always(s.OldestInFlightAge.Seconds()) }},
	{Prom: "share_max_delivery_count", OTel: "safeack.share.delivery_count.max", Unit: "{delivery}",
		Help:  "Highest share group delivery count seen.",
		Value: func(s *Share) (float64, bool) { return always(float64(s.MaxDeliveryCount)) }},
}

// acknowledgementsHelp describes the OpenTelemetry counter of
// acknowledgements, whose series differ in safeack.share.ack.
const acknowledgementsHelp = "Records acknowledged, by acknowledgement (safeack.share.ack): accept, release (delivered again) or reject (archived)."

// ShareCounters are a ShareSubscriber's per-partition counters, in
// exposition order.
var ShareCounters = []Counter[Share]{
	{Prom: "offered_records_total", OTel: "messaging.client.consumed.messages", Unit: "{message}",
		Help:  "Records received from the share group, redeliveries included.",
		Value: func(s *Share) float64 { return float64(s.Received) }},
	{Prom: "unmarshal_failures_total", OTel: "safeack.unmarshal_failures", Unit: "{message}",
		Help:  "Records the unmarshaler rejected.",
		Value: func(s *Share) float64 { return float64(s.UnmarshalFailures) }},
	{Prom: "deferred_completions_total", OTel: "safeack.completions.deferred", Unit: "{message}",
		Help:  "Completions deferred with safeack.Defer.",
		Value: func(s *Share) float64 { return float64(s.Deferred) }},
	{Prom: "share_accepted_records_total", OTel: "safeack.share.acknowledgements", Unit: "{message}", Ack: "accept",
		OTelHelp: acknowledgementsHelp,
		Help:     "Records acknowledged ACCEPT (acked, dead-lettered, or taken by OnUnmarshalError).",
		Value:    func(s *Share) float64 { return float64(s.Accepted) }},
	{Prom: "share_released_records_total", OTel: "safeack.share.acknowledgements", Unit: "{message}", Ack: "release",
		OTelHelp: acknowledgementsHelp,
		Help:     "Records acknowledged RELEASE (nacked, unanswered at Close, or given back): delivered again.",
		Value:    func(s *Share) float64 { return float64(s.Released) }},
	{Prom: "share_rejected_records_total", OTel: "safeack.share.acknowledgements", Unit: "{message}", Ack: "reject",
		OTelHelp: acknowledgementsHelp,
		Help:     "Records acknowledged REJECT (RejectPoison, past MaxDeliveries, or unmarshal failures): archived, never delivered again.",
		Value:    func(s *Share) float64 { return float64(s.Rejected) }},
	{Prom: "share_dead_lettered_records_total", OTel: "safeack.share.records.dead_lettered", Unit: "{message}",
		Help:  "Records dead-lettered and accepted: past MaxDeliveries handed to DeadLetter, or published by safeack.PoisonQueue.",
		Value: func(s *Share) float64 { return float64(s.DeadLettered) }},
	{Prom: "share_released_at_close_records_total", OTel: "safeack.share.records.released_at_close", Unit: "{message}",
		Help:  "Records released because the subscription ended before they were answered.",
		Value: func(s *Share) float64 { return float64(s.ReleasedAtClose) }},
	{Prom: "share_redelivered_records_total", OTel: "safeack.share.records.redelivered", Unit: "{message}",
		Help:  "Records received with a delivery count above one.",
		Value: func(s *Share) float64 { return float64(s.Redelivered) }},
	{Prom: "share_ack_errors_total", OTel: "safeack.share.ack_errors", Unit: "{partition}",
		Help:  "Partition acknowledgements the broker refused; their records are delivered again.",
		Value: func(s *Share) float64 { return float64(s.AckErrors) }},
	{Prom: "share_skipped_closing_records_total", OTel: "safeack.records.skipped", Unit: "{message}", Reason: "closing",
		Help:  "Messages whose handler SkipRevoked did not run because the subscriber was closing.",
		Value: func(s *Share) float64 { return float64(s.SkippedClosing) }},
	{Prom: "share_lock_renewals_total", OTel: "safeack.share.lock_renewals", Unit: "{renewal}",
		Help:  "Acquisition lock renewals of records whose answer took more than half their lock.",
		Value: func(s *Share) float64 { return float64(s.LockRenewals) }},
	{Prom: "share_given_back_records_total", OTel: "safeack.share.records.given_back", Unit: "{message}",
		Help:  "Records released without being handed out: they waited half their acquisition lock with no handler about to take them. Each cost a delivery attempt.",
		Value: func(s *Share) float64 { return float64(s.GivenBack) }},
}
