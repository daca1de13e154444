package main

import (
	"fmt"
	"io"
	"strings"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// progress shows an operation moving: on a terminal one line redrawn in
// place, a bar of steps done out of the total with the current step; on
// anything else (a pipe, a log file) one plain line per change.
type progress struct {
	w     io.Writer
	name  string
	tty   bool
	width int
	last  *clv1.OperationMetadata
	drawn bool
}

func newProgress(w io.Writer, name string) *progress {
	tty, width := isTerminal(w)
	return &progress{w: w, name: name, tty: tty, width: width}
}

// update is the client.ProgressFunc: it is called on every change.
func (p *progress) update(md *clv1.OperationMetadata) {
	p.last = md
	if p.tty {
		p.draw(md, md.GetStepsDone())
		return
	}
	fmt.Fprintf(p.w, "%s %s: %s (%d/%d steps)%s\n", p.name, md.GetVerb(), stepOf(md), md.GetStepsDone(), md.GetStepsTotal(), cancelling(md))
}

// finish ends the display with how the operation ended.
func (p *progress) finish(op *longrunningpb.Operation) {
	md, err := client.MetadataOf(op)
	if err != nil {
		md = p.last
	}
	result := operationStatus(op)
	if p.tty {
		done := md.GetStepsDone()
		if result == "succeeded" {
			done = md.GetStepsTotal()
		}
		p.draw(md, done)
		fmt.Fprintf(p.w, "  %s\n", result)
		return
	}
	fmt.Fprintf(p.w, "%s %s: %s\n", p.name, md.GetVerb(), result)
}

// abandon ends a drawn line when the wait stops early.
func (p *progress) abandon() {
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
	}
}

// draw redraws the line "[█████░░░░░] 4/9 join_node", under a first line
// that names the operation once: "create operations/…".
func (p *progress) draw(md *clv1.OperationMetadata, done int32) {
	if !p.drawn {
		fmt.Fprintf(p.w, "%s %s\n", md.GetVerb(), p.name)
		p.drawn = true
	}
	total := md.GetStepsTotal()
	tail := fmt.Sprintf(" %d/%d %s%s", done, total, stepOf(md), cancelling(md))
	// The last column stays empty: writing there wraps on some terminals,
	// and a wrapped line cannot be redrawn in place. "  succeeded" follows.
	room := p.width - 1 - len("  succeeded")
	// The bar keeps its width as the step changes: room is kept for the
	// longest step names and counts, not for this one.
	barWidth := min(30, room-2-len(" 999/999 deploy_autoscaler (cancelling)"))
	var bar string
	if barWidth >= 5 {
		filled := 0
		if total > 0 {
			filled = int(int64(barWidth) * int64(min(done, total)) / int64(total))
		}
		bar = "[" + strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled) + "]"
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
