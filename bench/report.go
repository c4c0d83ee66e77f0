package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// section is one workload's results, ready to print.
type section struct {
	w       *workload
	order   []string
	results map[string][]*result
}

// refRow is a published figure shown for comparison, not measured here.
type refRow struct {
	label string
	wall  time.Duration
	n     int
}

func newSection(w *workload) *section {
	return &section{w: w, results: map[string][]*result{}}
}

func (s *section) add(label string, r *result) {
	if _, ok := s.results[label]; !ok {
		s.order = append(s.order, label)
	}
	s.results[label] = append(s.results[label], r)
}

func (s *section) ok(label string) []*result {
	var out []*result
	for _, r := range s.results[label] {
		if r.err == nil {
			out = append(out, r)
		}
	}
	return out
}

// medianRate is the median records/s of a label's successful runs, 0 if none.
func (s *section) medianRate(label string) float64 {
	rs := s.ok(label)
	if len(rs) == 0 {
		return 0
	}
	return median(mapf(rs, func(r *result) float64 { return r.rate() }))
}

var colTitles = map[string]string{
	"wall":     "wall s",
	"startup":  "startup s",
	"rate":     "rec/s",
	"xideal":   "×ideal",
	"xwmk":     "×wm-kafka",
	"xbare":    "×bare",
	"xgroup":   "×group",
	"commit":   "commit s",
	"cpu":      "CPU s",
	"cpupm":    "CPU s/M rec",
	"heap":     "heap MB",
	"rss":      "RSS MB",
	"retained": "peak retained",
	"dups":     "dup acks",
	"endlag":   "end lag s",
	"cover":    "ack→commit p50/p99 ms",
	"allocs":   "allocs/rec",
	"xceil":    "×ceiling",
	"xrouter":  "×router",
	"e2e":      "e2e p50/p99/p99.9 ms",
	"e2emax":   "e2e max ms",
	"offered":  "offered rec/s",
	// restart-cost
	"x:behind":    "acked behind head",
	"x:committed": "committed@crash",
	"x:meta":      "meta B",
	"x:crash":     "crash s",
	"x:phase2":    "handled after restart",
	"x:dups":      "handled twice",
	"x:recovery":  "recovery s",
	// share workloads
	"x:poisoned":  "poison handled",
	"x:busiest":   "busiest process %",
	"x:givenback": "given back",
	// churn
	"x:ready":     "ready s",
	"x:basegap":   "steady gap ms",
	"x:gapp99":    "unmoved gap p99 ms",
	"x:gapmax":    "unmoved gap max ms",
	"x:unmoved":   "unmoved",
	"x:moved":     "moved",
	"x:resp50":    "stop→resume p50 ms",
	"x:resp99":    "stop→resume p99 ms",
	"x:resmax":    "stop→resume max ms",
	"x:drainmax":  "drain max ms",
	"x:xdrainmax": "resume − drain max ms",
	"x:minlag":    "min lag",
	"x:basestall": "steady stall ms",
	"x:stall":     "stall max ms",
	"x:assignp50": "stop→assigned p50 ms",
	"x:assignmax": "stop→assigned max ms",
	"x:firstp50":  "assigned→first p50 ms",
	"x:firstmax":  "assigned→first max ms",
	"x:gapbeyond": "gap beyond stall ms",
	"x:churndups": "dup acks",
	"x:load":      "load",
}

// rows returns the table: header, then one row per label, ideal and refs.
func (s *section) rows() [][]string {
	cols := s.w.cols
	head := []string{"contender"}
	for _, c := range cols {
		head = append(head, colTitles[c])
	}
	out := [][]string{head}
	for _, label := range s.order {
		row := []string{label}
		rs := s.ok(label)
		nerr := len(s.results[label]) - len(rs)
		if nerr > 0 {
			row[0] = fmt.Sprintf("%s (%d failed)", label, nerr)
		}
		for _, c := range cols {
			row = append(row, s.cell(c, label, rs))
		}
		out = append(out, row)
	}
	if s.w.idealRate > 0 && slices.Contains(cols, "rate") {
		row := []string{"ideal (computed)"}
		for _, c := range cols {
			switch c {
			case "wall":
				row = append(row, fmt.Sprintf("%.3f", s.w.idealWall.Seconds()))
			case "rate":
				row = append(row, fmtRate(s.w.idealRate))
			case "xideal":
				row = append(row, "1.00")
			case "xwmk":
				row = append(row, ratio(s.w.idealRate, s.medianRate("wm-kafka")))
			default:
				row = append(row, "")
			}
		}
		out = append(out, row)
	}
	for _, ref := range s.w.refs {
		row := []string{ref.label}
		rate := float64(ref.n) / ref.wall.Seconds()
		for _, c := range cols {
			switch c {
			case "wall":
				row = append(row, fmt.Sprintf("%.2f", ref.wall.Seconds()))
			case "rate":
				row = append(row, fmtRate(rate))
			case "xideal":
				row = append(row, ratio(rate, s.w.idealRate))
			default:
				row = append(row, "")
			}
		}
		out = append(out, row)
	}
	return out
}

func (s *section) cell(col, label string, rs []*result) string {
	if len(rs) == 0 {
		return "—"
	}
	med := func(f func(*result) float64) float64 { return median(mapf(rs, f)) }
	spread := func(f func(*result) float64, format func(float64) string) string {
		vals := mapf(rs, f)
		m := format(median(vals))
		if len(vals) < 2 {
			return m
		}
		return fmt.Sprintf("%s [%s–%s]", m, format(slices.Min(vals)), format(slices.Max(vals)))
	}
	sec3 := func(x float64) string { return fmt.Sprintf("%.3f", x) }
	switch col {
	case "wall":
		return spread(func(r *result) float64 { return r.wall.Seconds() }, sec3)
	case "startup":
		return spread(func(r *result) float64 { return r.startup.Seconds() }, sec3)
	case "endlag":
		if rs[0].noKafka {
			return ""
		}
		return untilCell(rs, func(r *result) time.Duration { return r.endLag }, true)
	case "cover":
		if rs[0].noKafka {
			return ""
		}
		return lagCell(rs, func(r *result) lagStats { return r.cover }, false)
	case "e2e":
		return lagCell(rs, func(r *result) lagStats { return r.e2e }, true)
	case "e2emax":
		var vals []float64
		for _, r := range rs {
			if r.e2e.ok() {
				vals = append(vals, ms(r.e2e.max))
			}
		}
		if len(vals) == 0 {
			return "—"
		}
		return fmtMs(slices.Max(vals))
	case "offered":
		return fmtRate(med(func(r *result) float64 { return r.offered }))
	case "allocs":
		var vals []float64
		for _, r := range rs {
			if r.allocs >= 0 {
				vals = append(vals, r.allocs)
			}
		}
		if len(vals) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f", median(vals))
	case "xceil":
		return ratio(s.medianRate(label), s.medianRate(ceilingLabel))
	case "xrouter":
		return ratio(s.medianRate(label), s.medianRate(routerCeilingLabel))
	case "rate":
		return spread((*result).rate, fmtRate)
	case "xideal":
		return ratio(s.medianRate(label), s.w.idealRate)
	case "xwmk":
		return ratio(s.medianRate(label), s.medianRate("wm-kafka"))
	case "xbare":
		return ratio(s.medianRate(label), s.medianRate("sarama-bare"))
	case "xgroup":
		return ratio(s.medianRate(label), s.medianRate(shareGroupLabel))
	case "commit":
		if rs[0].noKafka {
			return ""
		}
		return untilCell(rs, func(r *result) time.Duration { return r.commit }, false)
	case "cpu":
		return fmt.Sprintf("%.2f", med(func(r *result) float64 { return r.cpu.Seconds() }))
	case "cpupm":
		return fmt.Sprintf("%.2f", med(func(r *result) float64 { return r.cpu.Seconds() / float64(r.n) * 1e6 }))
	case "heap":
		return fmt.Sprintf("%.0f", med(func(r *result) float64 { return float64(r.heapPeak-min(r.heapBase, r.heapPeak)) / (1 << 20) }))
	case "rss":
		return fmt.Sprintf("%.0f", med(func(r *result) float64 { return float64(r.rssPeak) / (1 << 20) }))
	case "retained":
		if rs[0].retained < 0 {
			return ""
		}
		return fmt.Sprintf("%.0f", med(func(r *result) float64 { return float64(r.retained) }))
	case "dups":
		return fmt.Sprintf("%.0f", slices.Max(mapf(rs, func(r *result) float64 { return float64(r.dups) })))
	}
	if key, ok := strings.CutPrefix(col, "x:"); ok {
		vals := mapf(rs, func(r *result) float64 {
			if v, ok := r.extra[key]; ok {
				return v
			}
			return math.NaN()
		})
		vals = slices.DeleteFunc(vals, math.IsNaN)
		if len(vals) == 0 {
			return ""
		}
		format := func(x float64) string {
			if x == math.Trunc(x) && math.Abs(x) < 1e12 {
				return fmt.Sprintf("%.0f", x)
			}
			return fmt.Sprintf("%.3f", x)
		}
		if key == "committed" {
			format = func(x float64) string {
				if x < 0 {
					return "none"
				}
				return fmt.Sprintf("%.0f", x)
			}
		}
		m := format(median(vals))
		if len(vals) > 1 && slices.Min(vals) != slices.Max(vals) {
			m += fmt.Sprintf(" [%s–%s]", format(slices.Min(vals)), format(slices.Max(vals)))
		}
		return m
	}
	return "?"
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return ""
	}
	r := a / b
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

func fmtRate(x float64) string {
	if x <= 0 {
		return "0"
	}
	s := fmt.Sprintf("%.0f", x)
	// Thousands separators.
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtMB(b uint64) string { return fmt.Sprintf("%.0fMB", float64(b)/(1<<20)) }

// text renders the section as an aligned plain-text table.
func (s *section) text() string {
	rows := s.rows()
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — %s\n", s.w.name, s.w.desc)
	for ri, r := range rows {
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		b.WriteString("\n")
		if ri == 0 {
			total := len(width)*2 - 2
			for _, w := range width {
				total += w
			}
			b.WriteString(strings.Repeat("-", total) + "\n")
		}
	}
	for _, n := range s.w.notes {
		b.WriteString("  · " + n + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

func (s *section) markdown() string {
	rows := s.rows()
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n%s\n\n", s.w.name, s.w.desc)
	for ri, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
		if ri == 0 {
			seps := make([]string, len(r))
			for i := range seps {
				seps[i] = "---:"
			}
			seps[0] = "---"
			b.WriteString("| " + strings.Join(seps, " | ") + " |\n")
		}
	}
	b.WriteString("\n")
	for _, n := range s.w.notes {
		b.WriteString("- " + n + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

func writeMarkdown(path, header string, sections []*section, goals string) error {
	var b strings.Builder
	b.WriteString("## safeack benchmark\n\n```\n" + strings.TrimRight(header, "\n") + "\n```\n\n")
	fmt.Fprintf(&b, "Command: `go -C bench run . %s`\n\n", strings.Join(os.Args[1:], " "))
	for _, s := range sections {
		b.WriteString(s.markdown())
	}
	if g, ok := strings.CutPrefix(goals, goalsHeader); ok {
		b.WriteString("### goals (issues 17 and 43)\n\n```\n" + strings.TrimRight(g, "\n") + "\n```\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mapf[T any](xs []T, f func(T) float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

// untilCell is the cell of a time until something happened, in seconds:
// the median over the runs where it happened (get >= 0), with the range
// when withRange and more than one did, and how many runs never saw it.
func untilCell(rs []*result, get func(*result) time.Duration, withRange bool) string {
	never := 0
	var vals []float64
	for _, r := range rs {
		if d := get(r); d < 0 {
			never++
		} else {
			vals = append(vals, d.Seconds())
		}
	}
	if len(vals) == 0 {
		return "never"
	}
	sec3 := func(x float64) string { return fmt.Sprintf("%.3f", x) }
	out := sec3(median(vals))
	if withRange && len(vals) > 1 {
		out += fmt.Sprintf(" [%s–%s]", sec3(slices.Min(vals)), sec3(slices.Max(vals)))
	}
	if never > 0 {
		out += fmt.Sprintf(" (%d never)", never)
	}
	return out
}

// lagCell shows the medians over the runs of p50 and p99 (and p99.9), in
// ms, and how many records were never covered.
func lagCell(rs []*result, get func(*result) lagStats, p999 bool) string {
	var p50s, p99s, p999s []float64
	missing := 0
	for _, r := range rs {
		l := get(r)
		missing = max(missing, l.missing)
		if !l.ok() {
			continue
		}
		p50s = append(p50s, ms(l.p50))
		p99s = append(p99s, ms(l.p99))
		p999s = append(p999s, ms(l.p999))
	}
	if len(p50s) == 0 {
		if missing > 0 {
			return "never"
		}
		return "—"
	}
	out := fmtMs(median(p50s)) + "/" + fmtMs(median(p99s))
	if p999 {
		out += "/" + fmtMs(median(p999s))
	}
	if missing > 0 {
		out += fmt.Sprintf(" (%d uncovered)", missing)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtMs(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.2f", x)
}
