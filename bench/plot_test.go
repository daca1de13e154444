package bench_test

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// scanPoint is one scanner measurement: a backend and cluster count, the
// median pass and anti-join times in milliseconds.
type scanPoint struct {
	name         string // ScannerPass/<backend>/clusters=<n>
	service, raw float64
}

// plot draws scanner pass time (log) against cluster count (log), one line
// per backend for the pass and one dashed for its anti-join baseline.
func plot(path string, points []scanPoint) error {
	const (
		w, h                     = 980, 560
		left, right, top, bottom = 80, 270, 50, 60
	)
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	type series struct {
		label  string
		col    color.RGBA
		dashed bool
		xs, ys []float64
	}
	byName := map[string]*series{}
	var all []*series
	colors := map[string]color.RGBA{"sqlite": {0x1f, 0x77, 0xb4, 255}, "mysql": {0xd6, 0x27, 0x28, 255}}
	minY, maxY := math.Inf(1), math.Inf(-1)
	for _, p := range points {
		parts := strings.Split(p.name, "/")
		backend := parts[1]
		n, _ := strconv.Atoi(strings.TrimPrefix(parts[2], "clusters="))
		for _, kind := range []string{"pass", "anti-join"} {
			key := backend + " " + kind
			s := byName[key]
			if s == nil {
				label := map[string]string{"sqlite": "SQLite", "mysql": "MariaDB"}[backend] + ": " + map[string]string{"pass": "full scanner pass", "anti-join": "raw anti-join"}[kind]
				s = &series{label: label, col: colors[backend], dashed: kind == "anti-join"}
				byName[key] = s
				all = append(all, s)
			}
			v := p.service
			if kind == "anti-join" {
				v = p.raw
			}
			s.xs, s.ys = append(s.xs, float64(n)), append(s.ys, v)
			minY, maxY = math.Min(minY, v), math.Max(maxY, v)
		}
	}
	lo, hi := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	if hi == lo {
		hi++
	}
	px := func(n float64) int { return left + int((math.Log10(n)-3)/2*float64(w-left-right)) }
	py := func(v float64) int { return h - bottom - int((math.Log10(v)-lo)/(hi-lo)*float64(h-top-bottom)) }
	grey, black := color.RGBA{0xdd, 0xdd, 0xdd, 255}, color.RGBA{0, 0, 0, 255}
	text := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	line := func(x0, y0, x1, y1 int, c color.Color, dashed bool, thick int) {
		steps := max(abs(x1-x0), abs(y1-y0), 1)
		for i := 0; i <= steps; i++ {
			if dashed && (i/6)%2 == 1 {
				continue
			}
			x, y := x0+(x1-x0)*i/steps, y0+(y1-y0)*i/steps
			for dx := 0; dx < thick; dx++ {
				for dy := 0; dy < thick; dy++ {
					img.Set(x+dx, y+dy, c)
				}
			}
		}
	}
	for e := lo; e <= hi; e++ {
		y := py(math.Pow(10, e))
		line(left, y, w-right, y, grey, false, 1)
		text(left-60, y+4, fmt.Sprintf("%g ms", math.Pow(10, e)), black)
	}
	for _, n := range []float64{1000, 10000, 100000} {
		x := px(n)
		line(x, top, x, h-bottom, grey, false, 1)
		text(x-20, h-bottom+20, fmt.Sprintf("%gk", n/1000), black)
	}
	line(left, h-bottom, w-right, h-bottom, black, false, 1)
	line(left, top, left, h-bottom, black, false, 1)
	text(left, 30, "clusterd: scanner pass time against cluster count (log-log; medians)", black)
	text((w-right)/2-40, h-20, "clusters", black)
	for i, s := range all {
		for j := 1; j < len(s.xs); j++ {
			line(px(s.xs[j-1]), py(s.ys[j-1]), px(s.xs[j]), py(s.ys[j]), s.col, s.dashed, 2)
		}
		for j := range s.xs {
			x, y := px(s.xs[j]), py(s.ys[j])
			for dx := -3; dx <= 3; dx++ {
				for dy := -3; dy <= 3; dy++ {
					img.Set(x+dx, y+dy, s.col)
				}
			}
		}
		ly := top + 20 + 22*i
		line(w-right+15, ly-4, w-right+45, ly-4, s.col, s.dashed, 2)
		text(w-right+52, ly, s.label, black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
