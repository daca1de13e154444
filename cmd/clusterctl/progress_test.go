package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestProgressNeverGoesBack: on a terminal, when a step adds steps (the
// total grows from 11 to 13) the count and the bar hold rather than shrink,
// the elapsed time since the operation began is shown, and success fills
// the bar.
func TestProgressNeverGoesBack(t *testing.T) {
	var screen bytes.Buffer
	begun := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := begun
	p := &progress{w: &screen, name: "operations/x", tty: true, width: 100, now: func() time.Time { return clock }, begun: clock, stop: make(chan struct{})}
	md := func(done, total int32, step string) *clv1.OperationMetadata {
		return &clv1.OperationMetadata{Verb: "scale", Step: step, StepsDone: done, StepsTotal: total, CreateTime: timestamppb.New(begun)}
	}
	for _, m := range []*clv1.OperationMetadata{md(0, 11, "provision_machine"), md(6, 11, "join_node"), md(6, 13, "join_node"), md(5, 13, "drain_node"), md(12, 13, "deploy_autoscaler")} {
		clock = clock.Add(7 * time.Second)
		p.update(m)
	}
	last := md(13, 13, "deploy_autoscaler")
	last.EndTime = timestamppb.New(clock.Add(time.Second))
	packed, err := anypb.New(last)
	if err != nil {
		t.Fatal(err)
	}
	p.finish(&longrunningpb.Operation{Name: "operations/x", Done: true, Metadata: packed, Result: &longrunningpb.Operation_Response{}})

	draws := regexp.MustCompile(`\r\[(█*)(░*)\]\s+(\S+) (\d+)/(\d+) (\S+)\x1b\[K`).FindAllStringSubmatch(screen.String(), -1)
	if len(draws) != 6 {
		t.Fatalf("%d drawings in %q; want 6", len(draws), screen.String())
	}
	prevFilled, prevDone := 0, 0
	for i, d := range draws {
		filled := len([]rune(d[1]))
		done, _ := strconv.Atoi(d[4])
		if filled < prevFilled || done < prevDone {
			t.Errorf("drawing %d %q went back from %d cells, %d done", i, d[0], prevFilled, prevDone)
		}
		prevFilled, prevDone = filled, done
	}
	if got := draws[3]; got[3] != "28s" || got[4] != "6" || got[5] != "13" {
		t.Errorf("after the total grew and the count dropped: %q; want 6/13 at 28s", got[0])
	}
	if got := draws[5]; got[2] != "" || got[4] != "13" || got[5] != "13" || got[3] != "36s" || !strings.HasSuffix(screen.String(), "  succeeded\n") {
		t.Errorf("the last drawing %q; want a full bar, 13/13 after 36s, then succeeded", got[0])
	}
}
