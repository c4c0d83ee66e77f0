package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// drawChart draws one horizontal bar panel per workload (median records/s
// per contender, plus the computed ideal), stacked in one image. The bare
// Sarama loop is left out of workloads with work, where it is no
// comparison and would flatten every other bar.
func drawChart(path string, sections []*section) error {
	type panel struct {
		p    *plot.Plot
		rows int
	}
	var panels []panel
	for _, s := range sections {
		if !slices.Contains(s.w.cols, "rate") {
			continue // steady and restart-cost: no records/s to show
		}
		var labels []string
		var vals plotter.Values
		for _, l := range s.order {
			if l == "sarama-bare" && s.w.idealRate > 0 {
				continue // zero work: it would dwarf every bar of an IO-bound workload
			}
			if r := s.medianRate(l); r > 0 {
				labels = append(labels, l)
				vals = append(vals, r)
			}
		}
		if s.w.idealRate > 0 && len(vals) > 0 {
			labels = append(labels, "ideal (computed)")
			vals = append(vals, s.w.idealRate)
		}
		if len(vals) == 0 {
			continue
		}
		p := plot.New()
		p.Title.Text = s.w.name + " — median records/s"
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.X.Label.Text = "records/s"
		p.X.Min = 0
		bars, err := plotter.NewBarChart(vals, vg.Points(12))
		if err != nil {
			return err
		}
		bars.Horizontal = true
		bars.Color = color.RGBA{R: 70, G: 120, B: 190, A: 255}
		bars.LineStyle.Width = 0
		p.Add(bars)
		// The inverted scale puts the first contender on top.
		p.NominalY(labels...)
		p.Y.Scale = plot.InvertedScale{Normalizer: plot.LinearScale{}}
		maxv := 0.0
		var xys plotter.XYs
		var texts []string
		for i, v := range vals {
			maxv = max(maxv, v)
			xys = append(xys, plotter.XY{X: v, Y: float64(i)})
			texts = append(texts, " "+fmtRate(v))
		}
		p.X.Max = maxv * 1.25
		p.X.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
			ticks := plot.DefaultTicks{}.Ticks(min, max)
			for i := range ticks {
				if ticks[i].Label != "" {
					ticks[i].Label = fmtRate(ticks[i].Value)
				}
			}
			return ticks
		})
		lab, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
		if err != nil {
			return err
		}
		for i := range lab.TextStyle {
			lab.TextStyle[i].Font.Size = vg.Points(8)
			lab.TextStyle[i].YAlign = draw.YCenter
		}
		p.Add(lab)
		panels = append(panels, panel{p: p, rows: len(vals)})
	}
	if len(panels) == 0 {
		return fmt.Errorf("nothing to chart")
	}
	const width = 8 * vg.Inch
	heights := make([]vg.Length, len(panels))
	total := vg.Length(0)
	for i, pn := range panels {
		heights[i] = vg.Points(90) + vg.Points(20)*vg.Length(pn.rows)
		total += heights[i]
	}

	var c vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		c = vgsvg.New(width, total)
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, total), vgimg.UseDPI(144))}
	default:
		return fmt.Errorf("%s: want .svg or .png", path)
	}
	dc := draw.New(c)
	top := total
	for i, pn := range panels {
		sub := dc
		gap := vg.Points(14)
		sub.Rectangle = vg.Rectangle{Min: vg.Point{X: 0, Y: top - heights[i]}, Max: vg.Point{X: width, Y: top - gap}}
		pn.p.Draw(sub)
		top -= heights[i]
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
