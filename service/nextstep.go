package service

import (
	"strings"

	"github.com/clusterd/clusterd/lifecycle"
)

// userVerbs are the requests a cluster's owner can make of a resting
// cluster, with the event each sends the state machine, in the order a
// next step names them. A scale sends SCALE_UP or SCALE_DOWN; one is enough
// to ask whether the state takes a scale.
var userVerbs = []struct {
	verb  string
	event lifecycle.Event
}{
	{"start", lifecycle.StartRequested},
	{"stop", lifecycle.StopRequested},
	{"scale", lifecycle.ScaleUpRequested},
	{"upgrade", lifecycle.UpgradeRequested},
	{"add nodes to", lifecycle.AddNodeRequested},
	{"remove nodes from", lifecycle.RemoveNodeRequested},
	{"delete", lifecycle.DestroyRequested},
}

// nextStepLead says, for the states a user must read about, what clusterd
// does by itself; the requests the state takes follow it (nextStep).
var nextStepLead = map[lifecycle.State]string{
	lifecycle.Alert: "clusterd brings it back to RUNNING by itself once every machine runs, has joined and runs the recorded " +
		"Kubernetes version (checked every reconcile interval); nodes on another version need an upgrade",
	lifecycle.Error: "its create failed and clusterd cannot repair it",
}

// nextStep is a cluster's next step for a person (Cluster.next_step): what
// clusterd does about its state, and the requests the state machine takes
// in it. Empty for the states that need nobody.
func nextStep(s lifecycle.State) string {
	lead, ok := nextStepLead[s]
	if !ok {
		return ""
	}
	var can []string
	for _, v := range userVerbs {
		if _, err := lifecycle.Next(s, v.event); err == nil {
			can = append(can, v.verb)
		}
	}
	if len(can) == 0 {
		return lead + "."
	}
	return lead + "; you can " + joinOr(can) + " it."
}

// joinOr joins words as "a, b or c".
func joinOr(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
