package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// tick is how often a terminal's progress line redraws its elapsed time
// when nothing else changed.
const tick = time.Second

// progress shows an operation moving: on a terminal one line redrawn in
// place, a bar of steps done out of the total with the time since the
// operation began and the current step; on anything else (a pipe, a log
// file) one plain line per change. The count and the bar never go back:
// when a step adds steps (the total grows), the count holds until the
// operation passes it.
type progress struct {
	w     io.Writer
	name  string
	tty   bool
	width int
	now   func() time.Time
	begun time.Time // the wait's start, until the metadata says when the operation began

	mu     sync.Mutex
	last   *clv1.OperationMetadata
	done   int32 // the most steps shown done
	total  int32 // the largest total shown
	filled int   // the most cells of the bar shown filled
	drawn  bool
	ended  bool

	stop    chan struct{}
	stopped sync.WaitGroup
}

func newProgress(w io.Writer, name string, now func() time.Time) *progress {
	tty, width := isTerminal(w)
	p := &progress{w: w, name: name, tty: tty, width: width, now: now, begun: now(), stop: make(chan struct{})}
	if tty {
		p.stopped.Add(1)
		go p.ticking()
	}
	return p
}

// ticking redraws the line every tick so the elapsed time moves while a
// step takes long; it ends when the display does (finish or abandon).
func (p *progress) ticking() {
	defer p.stopped.Done()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			if p.last != nil && !p.ended {
				p.draw(p.last, p.done)
			}
			p.mu.Unlock()
		}
	}
}

// end stops the ticking and waits for it.
func (p *progress) end() {
	p.mu.Lock()
	already := p.ended
	p.ended = true
	p.mu.Unlock()
	if !already {
		close(p.stop)
		p.stopped.Wait()
	}
}

// update is the client.ProgressFunc: it is called on every change.
func (p *progress) update(md *clv1.OperationMetadata) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = md
	p.done = max(p.done, md.GetStepsDone())
	p.total = max(p.total, md.GetStepsTotal(), p.done)
	if p.tty {
		p.draw(md, p.done)
		return
	}
	fmt.Fprintf(p.w, "%s %s: %s (%d/%d steps, %s)%s\n", p.name, md.GetVerb(), stepOf(md), p.done, p.total, p.elapsed(md), cancelling(md))
}

// finish ends the display with how the operation ended.
func (p *progress) finish(op *longrunningpb.Operation) {
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	md, err := client.MetadataOf(op)
	if err != nil {
		md = p.last
	}
	p.total = max(p.total, md.GetStepsTotal(), p.done)
	result := operationStatus(op)
	if p.tty {
		done := max(p.done, md.GetStepsDone())
		if result == "succeeded" {
			done = p.total
		}
		p.draw(md, done)
		fmt.Fprintf(p.w, "  %s\n", result)
		return
	}
	fmt.Fprintf(p.w, "%s %s: %s after %s\n", p.name, md.GetVerb(), result, p.elapsed(md))
}

// abandon ends a drawn line when the wait stops early.
func (p *progress) abandon() {
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
	}
}

// elapsed is the time since the operation began (its create_time), or
// until it ended.
func (p *progress) elapsed(md *clv1.OperationMetadata) string {
	from, to := p.begun, p.now()
	if md.GetCreateTime() != nil {
		from = md.GetCreateTime().AsTime()
	}
	if md.GetEndTime() != nil {
		to = md.GetEndTime().AsTime()
	}
	return shortDuration(to.Sub(from))
}

// draw redraws the line "[█████░░░░░]    12s 4/9 join_node", under a first
// line that names the operation once: "create operations/…". The caller
// holds mu.
func (p *progress) draw(md *clv1.OperationMetadata, done int32) {
	if !p.drawn {
		fmt.Fprintf(p.w, "%s %s\n", md.GetVerb(), p.name)
		p.drawn = true
	}
	total := p.total
	tail := fmt.Sprintf(" %6s %d/%d %s%s", p.elapsed(md), done, total, stepOf(md), cancelling(md))
	// The last column stays empty: writing there wraps on some terminals,
	// and a wrapped line cannot be redrawn in place. "  succeeded" follows.
	room := p.width - 1 - len("  succeeded")
	// The bar keeps its width as the step changes: room is kept for the
	// longest step names, counts and times, not for this one.
	barWidth := min(30, room-2-len(" 99d23h 999/999 deploy_autoscaler (cancelling)"))
	var bar string
	if barWidth >= 5 {
		filled := 0
		if total > 0 {
			filled = int(int64(barWidth) * int64(min(done, total)) / int64(total))
		}
		p.filled = max(p.filled, filled)
		bar = "[" + strings.Repeat("█", p.filled) + strings.Repeat("░", barWidth-p.filled) + "]"
	}
	line := bar + tail
	if r := []rune(line); len(r) > room && room > 10 {
		line = string(r[:room])
	}
	// Carriage return, the line, and clear what a longer line left.
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
}

// stepOf is the step an operation is at, "starting" before its first.
func stepOf(md *clv1.OperationMetadata) string {
	if md.GetStep() == "" {
		return "starting"
	}
	return md.GetStep()
}

func cancelling(md *clv1.OperationMetadata) string {
	if md.GetRequestedCancellation() {
		return " (cancelling)"
	}
	return ""
}
