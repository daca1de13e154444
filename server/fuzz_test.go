package server

import (
	"strings"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// fuzzTarget is a served clusterd (one per backend) and what a fuzz input
// is checked against.
type fuzzTarget struct {
	name string
	h    *harness
	// cluster is a RUNNING cluster the scale fuzzer aims at.
	cluster string
}

// fuzzTargets starts a server on each backend, with a small maximum cluster
// size so accepted requests stay cheap.
func fuzzTargets(f *testing.F) []fuzzTarget {
	var out []fuzzTarget
	for _, b := range repotest.Backends(f) {
		h := start(f, b, vCatalog)
		c := h.create(f, "fuzz-target", 1)
		out = append(out, fuzzTarget{name: b.Name, h: h, cluster: c.GetName()})
	}
	return out
}

// world is the rows a refused request must leave alone, read through the
// repository: every cluster's version and every job's status.
func world(t testing.TB, s *repository.Store) string {
	t.Helper()
	ctx := tctx(t)
	cs, err := s.ListClusters(ctx, repository.ClusterQuery{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	js, err := s.ListJobs(ctx, repository.JobQuery{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.ID + "@" + c.Expect().String() + ";")
	}
	for _, j := range js {
		b.WriteString(j.ID + "=" + string(j.Status) + ";")
	}
	return b.String()
}

// invoke sends raw wire bytes (any strings, valid UTF-8 or not) and, if the
// request was accepted, waits for its operation, so every input starts from
// a world at rest.
func (ft fuzzTarget) invoke(t *testing.T, method string, raw []byte, allowed ...codes.Code) {
	t.Helper()
	before := world(t, ft.h.seed)
	var op longrunningpb.Operation
	err := ft.h.conn.Invoke(tctx(t), method, rawRequest(raw), &op, grpc.ForceCodec(rawCodec{}))
	code := status.Code(err)
	if code == codes.OK {
		ft.h.wait(t, &op)
		return
	}
	if code == codes.Internal || code == codes.Unknown {
		t.Fatalf("%s on %s: %v", method, ft.name, err)
	}
	ok := false
	for _, a := range allowed {
		ok = ok || code == a
	}
	if !ok {
		t.Fatalf("%s on %s: %v; want one of %v", method, ft.name, err, allowed)
	}
	if after := world(t, ft.h.seed); after != before {
		t.Fatalf("%s on %s refused with %v but changed rows:\nbefore %s\nafter  %s", method, ft.name, code, before, after)
	}
}

func appendInt(b []byte, num protowire.Number, v int32) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(int64(v)))
}

func appendMessage(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// FuzzCreateCluster sends CreateClusterRequests built from arbitrary field
// values: never INTERNAL, and a refusal changes no row.
func FuzzCreateCluster(f *testing.F) {
	f.Add("web", "", "1.30.2", "medium", int32(1), int32(2), false, int32(0), int32(0), "")
	f.Add("Bad_Name", "x", "9.9.9", "small", int32(2), int32(0), true, int32(0), int32(3), "retry-1")
	f.Add("huge", "", "1.30.2", "medium", int32(2147483647), int32(2147483647), true, int32(1), int32(2147483647), "")
	f.Add("neg", "", "1.30.2", "medium", int32(-2147483648), int32(-1), true, int32(-1), int32(-2), "0192f0c1-7a3e-7000-8000-000000000000")
	f.Add("utf\xff", "d\xfe", "1.30.\xff", "med\xc3", int32(1), int32(1), false, int32(0), int32(0), "\xff")
	f.Add(strings.Repeat("a", 70), strings.Repeat("d", 1100), "1.30.2", "medium", int32(1), int32(1), false, int32(0), int32(0), "")
	targets := fuzzTargets(f)
	f.Fuzz(func(t *testing.T, name, desc, version, offering string, control, workers int32, autoscale bool, minSize, maxSize int32, requestID string) {
		cluster := wireString(nil, 2, name)
		cluster = wireString(cluster, 3, desc)
		cluster = wireString(cluster, 6, version)
		cluster = appendInt(cluster, 7, control)
		cluster = appendInt(cluster, 8, workers)
		cluster = wireString(cluster, 9, offering)
		as := protowire.AppendTag(nil, 1, protowire.VarintType)
		as = protowire.AppendVarint(as, protowire.EncodeBool(autoscale))
		as = appendInt(appendInt(as, 2, minSize), 3, maxSize)
		cluster = appendMessage(cluster, 10, as)
		req := wireString(appendMessage(nil, 1, cluster), 2, requestID)
		for _, ft := range targets {
			ft.invoke(t, "/clusterlifecycle.v1.ClusterLifecycle/CreateCluster", req, codes.InvalidArgument, codes.AlreadyExists)
		}
	})
}

// FuzzScaleCluster sends ScaleClusterRequests for a running cluster built
// from arbitrary field values: never INTERNAL, and a refusal changes no row.
func FuzzScaleCluster(f *testing.F) {
	f.Add(true, int32(2), "", "", false, int32(0), int32(0), "", "")
	f.Add(true, int32(2147483647), "", "large", false, int32(0), int32(0), "1", "x")
	f.Add(false, int32(0), "machines/0192f0c1-7a3e-7000-8000-000000000000\nmachines/x", "", true, int32(1), int32(2147483647), "", "")
	f.Add(true, int32(-5), "\xff", "\xfe", true, int32(-1), int32(-1), "\xff", "\xff")
	f.Add(false, int32(0), "", "", true, int32(1), int32(3), "", "")
	targets := fuzzTargets(f)
	f.Fuzz(func(t *testing.T, setWorkers bool, workers int32, remove, offering string, autoscale bool, minSize, maxSize int32, etag, requestID string) {
		for _, ft := range targets {
			req := wireString(nil, 1, ft.cluster)
			if setWorkers {
				req = appendInt(req, 2, workers)
			}
			if remove != "" {
				for _, r := range strings.Split(remove, "\n") {
					req = wireString(req, 3, r)
				}
			}
			req = wireString(req, 4, offering)
			if autoscale || minSize != 0 || maxSize != 0 {
				as := protowire.AppendTag(nil, 1, protowire.VarintType)
				as = protowire.AppendVarint(as, protowire.EncodeBool(autoscale))
				req = appendMessage(req, 5, appendInt(appendInt(as, 2, minSize), 3, maxSize))
			}
			req = wireString(wireString(req, 6, requestID), 7, etag)
			ft.invoke(t, "/clusterlifecycle.v1.ClusterLifecycle/ScaleCluster", req,
				codes.InvalidArgument, codes.FailedPrecondition, codes.Aborted)
		}
	})
}
