//go:build chaos

package chaos

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/safeack/safeack/frontier"
)

// debugDupCommits logs the commit requests of the partition of the first
// duplicated record around its acks (SAFEACK_CHAOS_DEBUG=1).
func (sc *scenario) debugDupCommits() {
	if os.Getenv("SAFEACK_CHAOS_DEBUG") == "" || sc.commits == nil {
		return
	}
	l := sc.led
	l.mu.Lock()
	var first po
	found := false
	for k, n := range l.acks {
		if n > 1 && (!found || k.o < first.o) {
			first, found = k, true
		}
	}
	var times []time.Time
	var base time.Time
	for _, e := range l.events {
		if e.kind == 'A' && (base.IsZero() || e.at.Before(base)) {
			base = e.at
		}
		if e.kind == 'A' && (po{e.p, e.o}) == first {
			times = append(times, e.at)
		}
	}
	l.mu.Unlock()
	if !found {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "commits of partition %d around duplicate %v (acks at", first.p, first)
	for _, at := range times {
		fmt.Fprintf(&b, " +%v", at.Sub(base).Round(time.Millisecond))
	}
	b.WriteString("):\n")
	for _, o := range sc.commits.Commits() {
		co, ok := o.Offset(sc.topic, first.p)
		if !ok || o.At.Before(times[0].Add(-2*time.Second)) || o.At.After(times[len(times)-1].Add(time.Second)) {
			continue
		}
		tail, _ := frontier.DecodeTail(co.Metadata, co.Offset)
		fmt.Fprintf(&b, "  +%v #%d gen %d member %s offset %d tail %v\n", o.At.Sub(base).Round(time.Millisecond), o.Seq, o.Generation, o.MemberID, co.Offset, tail.Ranges)
	}
	sc.t.Log(b.String())
}
