package service_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/clusterd/clusterd/auth"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// TestGetClusterReadsAsTheTwoReadsDid holds GetCluster over the simulator,
// which reads a cluster and its machines in one statement, to GetCluster over
// an infrastructure that lists machines only (as the libvirt driver does):
// the same answer for a cluster with its nodes, and the same error for a
// cluster of an account the caller may not see, a missing one and a name
// that is not one.
func TestGetClusterReadsAsTheTwoReadsDid(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newBudgetEnv(t, b)
			// The same handlers over the same simulator, seen only as an
			// infra.Infrastructure.
			twoReads := service.NewClusters(service.ClustersConfig{
				Store: e.store, Infra: struct{ infra.Infrastructure }{e.infra}, ServerID: "s1", Incarnation: e.self.Incarnation,
			})
			ctx := rpcCtx(t)
			op, err := e.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
				DisplayName: "get", KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 2, ServiceOffering: "medium",
			}})
			if err != nil {
				t.Fatal(err)
			}
			e.wait(t, op)
			name := clusterOf(t, op)

			other := auth.NewContext(context.Background(), auth.Identity{Account: "globex", Role: auth.RoleUser, Subject: "test"})
			cases := []struct {
				what string
				ctx  context.Context
				name string
				code codes.Code
			}{
				{"a cluster of the caller's", ctx, name, codes.OK},
				{"a cluster of another account", other, name, codes.NotFound},
				{"a missing cluster", ctx, "clusters/00000000-0000-7000-8000-000000000000", codes.NotFound},
				{"not a cluster's name", ctx, "operations/x", codes.InvalidArgument},
			}
			for _, c := range cases {
				got, gotErr := e.clusters.GetCluster(c.ctx, &clv1.GetClusterRequest{Name: c.name})
				want, wantErr := twoReads.GetCluster(c.ctx, &clv1.GetClusterRequest{Name: c.name})
				if code := service.Status(gotErr).Code(); code != c.code {
					t.Errorf("%s: %v; want %s", c.what, gotErr, c.code)
				}
				if service.Status(gotErr).Message() != service.Status(wantErr).Message() || service.Status(gotErr).Code() != service.Status(wantErr).Code() {
					t.Errorf("%s: %v; the two reads answered %v", c.what, gotErr, wantErr)
				}
				if !proto.Equal(got, want) {
					t.Errorf("%s: %v; the two reads answered %v", c.what, got, want)
				}
				if c.code == codes.OK && len(got.GetNodes()) != 3 {
					t.Errorf("%s: %d nodes; want 3", c.what, len(got.GetNodes()))
				}
			}
		})
	}
}
