package infra

import "testing"

// TestMismatch: every machine is compared with the record, not only with
// the others: nodes that all run one version other than the recorded one
// do not match (issue 17: a cancelled upgrade that had upgraded every node).
func TestMismatch(t *testing.T) {
	up := func(id, version string) Machine {
		return Machine{ID: id, Power: PowerRunning, Joined: true, KubernetesVersion: version}
	}
	off := up("m2", "1.30.2")
	off.Power = PowerStopped
	unjoined := Machine{ID: "m3", Power: PowerRunning}
	tests := []struct {
		name     string
		machines []Machine
		want     string
	}{
		{"all match", []Machine{up("m1", "1.30.2"), up("m2", "1.30.2")}, ""},
		{"none", nil, "the cluster has no machines"},
		{"all on another version", []Machine{up("m1", "1.30.5"), up("m2", "1.30.5")}, "nodes run 1.30.5 on 2 nodes, not the recorded 1.30.2"},
		{"mixed", []Machine{up("m1", "1.30.5"), up("m2", "1.30.2"), up("m3", "1.30.2")}, "nodes run 1.30.2 on 2 nodes, 1.30.5 on 1 node, not the recorded 1.30.2"},
		{"powered off", []Machine{up("m1", "1.30.2"), off}, "machine m2 is STOPPED"},
		{"not joined", []Machine{up("m1", "1.30.2"), unjoined}, "machine m3 has not joined"},
		{"everything", []Machine{up("m1", "1.30.5"), off, unjoined}, "machine m2 is STOPPED; machine m3 has not joined; nodes run 1.30.2 on 1 node, 1.30.5 on 1 node, not the recorded 1.30.2"},
	}
	for _, tc := range tests {
		if got := Mismatch(tc.machines, "1.30.2"); got != tc.want {
			t.Errorf("%s: Mismatch = %q; want %q", tc.name, got, tc.want)
		}
	}
}
