package service

import (
	"strings"
	"testing"

	"github.com/clusterd/clusterd/lifecycle"
)

// The next step of ALERT and ERROR clusters names exactly the requests the
// state machine takes in those states; no other state has one.
func TestNextStep(t *testing.T) {
	want := map[lifecycle.State]string{
		lifecycle.Alert: "you can start, stop, scale, upgrade, add nodes to, remove nodes from or delete it.",
		lifecycle.Error: "cannot repair it; you can delete it.",
	}
	for _, s := range lifecycle.States() {
		got := nextStep(s)
		if w, ok := want[s]; ok {
			if !strings.HasSuffix(got, w) {
				t.Errorf("nextStep(%s) = %q; want it to end %q", s, got, w)
			}
			continue
		}
		if got != "" {
			t.Errorf("nextStep(%s) = %q; want none", s, got)
		}
	}
}
