package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

// chartPanel is one workload's bars: median records/s per contender, plus
// the computed ideal. bench/chart, a module of its own, draws a file of
// them (so that the plotting libraries stay out of the workspace's
// module graph: `go test work` does not download them).
type chartPanel struct {
	Title  string    `json:"title"`
	Labels []string  `json:"labels"`
	Values []float64 `json:"values"`
}

// writeChartData writes one panel per workload with a records/s column
// to path, as JSON. The bare Sarama loop is left out of workloads with
// work, where it is no comparison and would flatten every other bar.
func writeChartData(path string, sections []*section) error {
	var panels []chartPanel
	for _, s := range sections {
		if !slices.Contains(s.w.cols, "rate") {
			continue // steady and restart-cost: no records/s to show
		}
		p := chartPanel{Title: s.w.name + " — median records/s"}
		for _, l := range s.order {
			if l == "sarama-bare" && s.w.idealRate > 0 {
				continue // zero work: it would dwarf every bar of an IO-bound workload
			}
			if r := s.medianRate(l); r > 0 {
				p.Labels = append(p.Labels, l)
				p.Values = append(p.Values, r)
			}
		}
		if s.w.idealRate > 0 && len(p.Values) > 0 {
			p.Labels = append(p.Labels, "ideal (computed)")
			p.Values = append(p.Values, s.w.idealRate)
		}
		if len(p.Values) > 0 {
			panels = append(panels, p)
		}
	}
	if len(panels) == 0 {
		return fmt.Errorf("nothing to chart")
	}
	b, err := json.MarshalIndent(panels, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
