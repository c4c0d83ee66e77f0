package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// goals checks issue 17's goals against this invocation's sections and
// says, per goal and workload, whether safeack met it. Every comparison is
// between medians of runs made in this invocation, on this machine.
const goalsHeader = "## goals (issues 17 and 43), from the runs above\n"

func goals(sections []*section) string {
	var b strings.Builder
	b.WriteString(goalsHeader)
	line := func(ok bool, format string, args ...any) {
		mark := "MET   "
		if !ok {
			mark = "MISSED"
		}
		fmt.Fprintf(&b, "  %s %s\n", mark, fmt.Sprintf(format, args...))
	}
	info := func(format string, args ...any) { fmt.Fprintf(&b, "         %s\n", fmt.Sprintf(format, args...)) }
	interval := commitInterval()
	for _, s := range sections {
		labels := s.labelsOf(kindSafeack)
		if len(labels) == 0 {
			continue
		}
		name := s.w.name
		if strings.HasPrefix(name, "share-") {
			continue // issue 26's comparison, not issue 17's goals
		}
		if name == "churn" {
			churnGoals(s, line, info)
			continue
		}
		protocolGoals(s, line)
		// Commit lag: end lag and per-record p99, against one interval
		// plus one round trip (plus the watcher's poll, since its
		// observations are late by up to that much).
		if slices.Contains(s.w.cols, "endlag") {
			rtt := s.medianOf(func(r *result) float64 { return float64(r.rtt) }, s.order)
			bound := interval + time.Duration(rtt) + opt.commitPoll
			worstEnd, worstP99 := -1.0, -1.0
			var whoEnd, whoP99 string
			never := false
			for _, l := range labels {
				rs := s.ok(l)
				if len(rs) == 0 {
					continue
				}
				for _, r := range rs {
					if r.endLag < 0 {
						never = true
					}
				}
				if e := median(mapf(rs, func(r *result) float64 { return r.endLag.Seconds() })); e > worstEnd {
					worstEnd, whoEnd = e, l
				}
				if p := median(mapf(rs, func(r *result) float64 { return ms(r.cover.p99) })); p > worstP99 {
					worstP99, whoP99 = p, l
				}
			}
			if worstEnd >= 0 {
				line(!never && worstEnd <= bound.Seconds() && worstP99 <= ms(bound),
					"%s commit lag: worst safeack end lag %.3f s (%s), worst ack→commit p99 %s ms (%s); bound = interval %v + round trip %s ms + poll %v = %s ms",
					name, worstEnd, whoEnd, fmtMs(worstP99), whoP99, interval, fmtMs(rtt/1e6), opt.commitPoll, fmtMs(ms(bound)))
				if pcs := s.labelsOf(kindPC); len(pcs) > 0 {
					var ends []float64
					for _, l := range pcs {
						if rs := s.ok(l); len(rs) > 0 {
							ends = append(ends, median(mapf(rs, func(r *result) float64 { return r.endLag.Seconds() })))
						}
					}
					if len(ends) > 0 {
						info("Parallel Consumer end lag (median per row) %.3f–%.3f s", slices.Min(ends), slices.Max(ends))
					}
				}
				if worstEnd > float64(2*opt.commitPoll+time.Duration(rtt))/1e9+0.2 {
					info("early commit: the end lag should be about one round trip once every record is complete; it is %.3f s", worstEnd)
				}
			}
		}
		// Start-up against watermill-kafka's and Parallel Consumer's medians.
		if slices.Contains(s.w.cols, "startup") {
			worst, who := -1.0, ""
			for _, l := range labels {
				if rs := s.ok(l); len(rs) > 0 {
					if v := median(mapf(rs, func(r *result) float64 { return r.startup.Seconds() })); v > worst {
						worst, who = v, l
					}
				}
			}
			wmk := s.medianOf(func(r *result) float64 { return r.startup.Seconds() }, []string{"wm-kafka"})
			pc := s.medianOf(func(r *result) float64 { return r.startup.Seconds() }, s.labelsOf(kindPC))
			if worst >= 0 && (wmk > 0 || pc > 0) {
				ok := (wmk <= 0 || worst <= wmk) && (pc <= 0 || worst <= pc)
				pcs := "not run"
				if pc > 0 {
					pcs = fmt.Sprintf("%.3f s", pc)
				}
				line(ok, "%s start-up: slowest safeack median %.3f s (%s); wm-kafka %.3f s; Parallel Consumer (median of its runs) %s",
					name, worst, who, wmk, pcs)
			}
		}
		if name == "zero-work" {
			heap := func(l string) float64 {
				return s.medianOf(func(r *result) float64 { return float64(r.heapPeak - min(r.heapBase, r.heapPeak)) }, []string{l})
			}
			rss := func(l string) float64 {
				return s.medianOf(func(r *result) float64 { return float64(r.rssPeak) }, []string{l})
			}
			for _, l := range labels {
				// A row read through a Router is held to watermill-kafka read
				// through one, when that ran: the Router's own allocations
				// are in both.
				ref := "wm-kafka"
				if strings.HasSuffix(l, " (router)") && heap(wmkRouterLabel) > 0 {
					ref = wmkRouterLabel
				}
				if heap(ref) <= 0 {
					continue
				}
				h, r := heap(l), rss(l)
				line(h <= heap(ref) && r <= rss(ref), "zero-work memory %s: heap %.0f MB, RSS %.0f MB; %s heap %.0f MB, RSS %.0f MB",
					l, h/(1<<20), r/(1<<20), ref, heap(ref)/(1<<20), rss(ref)/(1<<20))
			}
			for _, ceil := range []string{ceilingLabel, routerCeilingLabel} {
				c := s.medianRate(ceil)
				if c <= 0 {
					continue
				}
				for _, l := range labels {
					if r := s.medianRate(l); r > 0 {
						line(r >= 0.9*c, "zero-work %s at %.2f of the %s (%s vs %s rec/s; goal ≥ 0.9)", l, r/c, ceil, fmtRate(r), fmtRate(c))
					}
				}
			}
		}
	}
	if b.Len() == len(goalsHeader) {
		return "" // no workload with goals ran (the share workloads have none)
	}
	b.WriteString("  (MET/MISSED compare medians of this invocation's runs; with few reps on a loaded machine, read the tables' spreads too.)\n\n")
	return b.String()
}

// labelsOf lists the section's labels of one contender kind that ran.
func (s *section) labelsOf(k contenderKind) []string {
	var out []string
	for _, c := range s.w.cases {
		if c.kind == k && len(s.ok(c.label)) > 0 && !slices.Contains(out, c.label) {
			out = append(out, c.label)
		}
	}
	return out
}

// medianOf is the median of f's positive values over the successful runs
// of labels; 0 when none.
func (s *section) medianOf(f func(*result) float64, labels []string) float64 {
	var vals []float64
	for _, label := range labels {
		for _, r := range s.results[label] {
			if r.err == nil {
				if v := f(r); v > 0 {
					vals = append(vals, v)
				}
			}
		}
	}
	if len(vals) == 0 {
		return 0
	}
	return median(vals)
}

// churnGoals checks issue 43's goals for the consumer protocol in the churn
// workload: partitions that do not move never stop (longest gap at most
// 100 ms plus the handler's 2 ms), a moved partition resumes within 1 s
// plus its drain, and the rate is at least cooperative-sticky's. The gap
// and resume goals take the worst run, the rate the medians.
func churnGoals(s *section, line func(bool, string, ...any), info func(string, ...any)) {
	rs := s.ok(churnConsumer)
	if len(rs) == 0 {
		return
	}
	worst := func(label, key string) (float64, bool) {
		v, ok := math.Inf(-1), false
		for _, r := range s.ok(label) {
			if x, has := r.extra[key]; has {
				v, ok = max(v, x), true
			}
		}
		return v, ok
	}
	gapBound := 100 + ms(churnWork)
	if g, ok := worst(churnConsumer, "gapmax"); ok {
		stall, _ := worst(churnConsumer, "stall")
		beyond, _ := worst(churnConsumer, "gapbeyond")
		line(g <= gapBound, "churn, consumer protocol: partitions that did not move, longest gap %s ms over %d run(s) (goal ≤ %s ms = 100 ms + the 2 ms handler); the process's longest stall (no delivery at all) %s ms; largest gap beyond the process's silence inside it %s ms",
			fmtMs(g), len(rs), fmtMs(gapBound), fmtMs(stall), fmtMs(beyond))
	}
	if x, ok := worst(churnConsumer, "xdrainmax"); ok {
		res, _ := worst(churnConsumer, "resmax")
		line(x <= 1000, "churn, consumer protocol: a moved partition resumed at most %s ms after its stop beyond its drain (stop→resume max %s ms; goal ≤ 1000 ms + drain)", fmtMs(x), fmtMs(res))
	}
	if coop := s.medianRate(churnCooperative); coop > 0 {
		c := s.medianRate(churnConsumer)
		line(c >= coop, "churn, consumer protocol rate %s rec/s vs classic cooperative-sticky %s rec/s (%s; goal ≥ 1)", fmtRate(c), fmtRate(coop), ratio(c, coop))
	}
	for _, l := range []string{churnEager, churnCooperative} {
		if g, ok := worst(l, "gapmax"); ok {
			res, _ := worst(l, "resmax")
			info("%s: unmoved gap max %s ms, stop→resume max %s ms, %s rec/s", l, fmtMs(g), fmtMs(res), fmtRate(s.medianRate(l)))
		}
	}
	if opt.churnHeartbeat > 0 {
		info("heartbeats every %v on both protocols (-churn-heartbeat)", opt.churnHeartbeat)
	} else {
		info("each protocol's default heartbeat (classic 3 s, Sarama's; consumer: the broker's group.consumer.heartbeat.interval.ms)")
	}
}

// protocolGoals checks issue 43's goal for the steady workloads: the
// consumer-protocol row reaches at least the classic row's rate at no more
// CPU per record (medians).
func protocolGoals(s *section, line func(bool, string, ...any)) {
	cp, classic := s.ok(consumerProtocolLabel), s.ok("safeack/unordered")
	if len(cp) == 0 || len(classic) == 0 {
		return
	}
	cpu := func(rs []*result) float64 {
		return median(mapf(rs, func(r *result) float64 { return r.cpu.Seconds() / float64(r.n) * 1e6 }))
	}
	rc, rk := s.medianRate(consumerProtocolLabel), s.medianRate("safeack/unordered")
	cc, ck := cpu(cp), cpu(classic)
	span := func(rs []*result, f func(*result) float64) (lo, hi float64) {
		v := mapf(rs, f)
		return slices.Min(v), slices.Max(v)
	}
	note := ""
	rcLo, rcHi := span(cp, (*result).rate)
	rkLo, rkHi := span(classic, (*result).rate)
	if rc < rk && rcHi >= rkLo && rkHi >= rcLo {
		note = "; the rates' ranges overlap"
	}
	perM := func(r *result) float64 { return r.cpu.Seconds() / float64(r.n) * 1e6 }
	ccLo, ccHi := span(cp, perM)
	ckLo, ckHi := span(classic, perM)
	if cc > ck && ccHi >= ckLo && ckHi >= ccLo {
		note += "; the CPU ranges overlap"
	}
	line(rc >= rk && cc <= ck, "%s consumer protocol vs classic (safeack/unordered): %s [%s–%s] vs %s [%s–%s] rec/s (%s), CPU %.2f [%.2f–%.2f] vs %.2f [%.2f–%.2f] s per million records%s",
		s.w.name, fmtRate(rc), fmtRate(rcLo), fmtRate(rcHi), fmtRate(rk), fmtRate(rkLo), fmtRate(rkHi), ratio(rc, rk), cc, ccLo, ccHi, ck, ckLo, ckHi, note)
}
