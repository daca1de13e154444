package service

import (
	"testing"

	"github.com/clusterd/clusterd/repository"
)

func TestParseQuota(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		in   string
		want repository.Limits
		bad  bool
	}{
		{in: "", want: repository.Limits{}},
		{in: "clusters=10,nodes=100,cpus=400,memory_mb=819200", want: repository.Limits{Clusters: n(10), Nodes: n(100), CPUs: n(400), MemoryMB: n(819200)}},
		{in: " nodes=0 ", want: repository.Limits{Nodes: n(0)}},
		{in: "clusters=-1", bad: true},
		{in: "clusters=1,clusters=2", bad: true},
		{in: "gpus=1", bad: true},
		{in: "clusters", bad: true},
	} {
		got, err := ParseQuota(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseQuota(%q) = %+v; want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !sameLimits(got, tc.want) {
			t.Errorf("ParseQuota(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func sameLimits(a, b repository.Limits) bool {
	eq := func(x, y *int64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return eq(a.Clusters, b.Clusters) && eq(a.Nodes, b.Nodes) && eq(a.CPUs, b.CPUs) && eq(a.MemoryMB, b.MemoryMB)
}
