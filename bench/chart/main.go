// Command chart draws the bench's records/s chart: one horizontal bar
// panel per workload, stacked in one SVG or PNG image, from the panels the
// bench wrote with -chart-data. It is a module of its own, outside the
// repository's go.work, so that its plotting libraries (gonum/plot, fonts,
// LaTeX and PDF support) are downloaded only by who draws a chart, never
// by the workspace's test run:
//
//	go -C bench run . -markdown out.md -chart-data out.chart.json
//	go -C bench/chart run . -o ../../out.svg ../../out.chart.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// panel is one workload's bars, as the bench writes them.
type panel struct {
	Title  string    `json:"title"`
	Labels []string  `json:"labels"`
	Values []float64 `json:"values"`
}

func main() {
	out := flag.String("o", "", "image to write (.svg or .png)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: chart -o FILE.svg|FILE.png CHART-DATA.json")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *out); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var panels []panel
	if err := json.Unmarshal(b, &panels); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	for i, p := range panels {
		if len(p.Labels) != len(p.Values) || len(p.Values) == 0 {
			return fmt.Errorf("%s: panel %d (%q) has %d labels and %d values", in, i, p.Title, len(p.Labels), len(p.Values))
		}
	}
	if len(panels) == 0 {
		return fmt.Errorf("%s: nothing to chart", in)
	}
	return draw1(out, panels)
}

// draw1 draws the panels stacked in one image at path.
func draw1(path string, panels []panel) error {
	plots := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p, err := barPanel(pn)
		if err != nil {
			return err
		}
		plots[i] = p
	}
	const width = 8 * vg.Inch
	heights := make([]vg.Length, len(panels))
	total := vg.Length(0)
	for i, pn := range panels {
		heights[i] = vg.Points(90) + vg.Points(20)*vg.Length(len(pn.Values))
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
	for i, p := range plots {
		sub := dc
		gap := vg.Points(14)
		sub.Rectangle = vg.Rectangle{Min: vg.Point{X: 0, Y: top - heights[i]}, Max: vg.Point{X: width, Y: top - gap}}
		p.Draw(sub)
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

// barPanel is one workload's horizontal bars, first contender on top, each
// labelled with its value.
func barPanel(pn panel) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.Title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = "records/s"
	p.X.Min = 0
	bars, err := plotter.NewBarChart(plotter.Values(pn.Values), vg.Points(12))
	if err != nil {
		return nil, err
	}
	bars.Horizontal = true
	bars.Color = color.RGBA{R: 70, G: 120, B: 190, A: 255}
	bars.LineStyle.Width = 0
	p.Add(bars)
	// The inverted scale puts the first contender on top.
	p.NominalY(pn.Labels...)
	p.Y.Scale = plot.InvertedScale{Normalizer: plot.LinearScale{}}
	maxv := 0.0
	var xys plotter.XYs
	var texts []string
	for i, v := range pn.Values {
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
		return nil, err
	}
	for i := range lab.TextStyle {
		lab.TextStyle[i].Font.Size = vg.Points(8)
		lab.TextStyle[i].YAlign = draw.YCenter
	}
	p.Add(lab)
	return p, nil
}

// fmtRate writes x rounded, with thousands separators, as the bench does.
func fmtRate(x float64) string {
	if x <= 0 {
		return "0"
	}
	s := fmt.Sprintf("%.0f", x)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
