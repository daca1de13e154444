package server

import (
	"bytes"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// quotaFailure checks that err is RESOURCE_EXHAUSTED with the
// QUOTA_EXCEEDED ErrorInfo and returns its google.rpc.QuotaFailure.
func quotaFailure(t *testing.T, err error) *errdetails.QuotaFailure {
	t.Helper()
	code, reason, _ := errorInfo(t, err)
	if code != codes.ResourceExhausted || reason != service.ReasonQuotaExceeded {
		t.Fatalf("error %v: %s %s; want RESOURCE_EXHAUSTED QUOTA_EXCEEDED", err, code, reason)
	}
	for _, d := range status.Convert(err).Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			return qf
		}
	}
	t.Fatalf("error %v carries no google.rpc.QuotaFailure", err)
	return nil
}

// TestQuotaRaceOfCreatesOnTwoServers: 32 creates of one account race
// through two servers on one database against a default limit of 5
// clusters: exactly 5 are accepted, the others refused with a QuotaFailure
// naming the limit. On Galera the two servers write through two nodes.
func TestQuotaRaceOfCreatesOnTwoServers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		raceCreatesOnServers(t, []string{dsn, dsn})
	})
	t.Run("galera", func(t *testing.T) {
		g, ok := repotest.Galera(t)
		if !ok {
			return
		}
		raceCreatesOnServers(t, g.NodeDSNs(t)[:2])
	})
}

// raceCreatesOnServers starts a server on each DSN (one database) and races
// 32 creates through them.
func raceCreatesOnServers(t *testing.T, dsns []string) {
	limits, err := service.ParseQuota("clusters=5")
	if err != nil {
		t.Fatal(err)
	}
	var hs []*harness
	for i, dsn := range dsns {
		hs = append(hs, startOn(t, dsn, func(c *Config) {
			c.ServerID = fmt.Sprintf("quota-%d", i+1)
			c.DefaultQuota = limits
		}))
	}
	const racers = 32
	errs := make([]error, racers)
	names := make([]string, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// UNAVAILABLE ("please retry": on Galera, a create that
			// exhausted its lock-conflict attempts, or a stalled node) is
			// sent again with the request id through the other server, as
			// a client does, for up to 2 minutes.
			req := &clv1.CreateClusterRequest{RequestId: uuid.NewString(), Cluster: &clv1.Cluster{
				DisplayName: fmt.Sprintf("c%d", i), KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium",
			}}
			deadline := time.Now().Add(2 * time.Minute)
			for attempt := 0; ; attempt++ {
				op, err := hs[(i+attempt)%2].clients.clusters.CreateCluster(tctx(t), req)
				errs[i], names[i] = err, op.GetName()
				if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	close(start)
	wg.Wait()
	accepted := 0
	for i, err := range errs {
		if err == nil {
			accepted++
			hs[i%2].wait(t, &longrunningpb.Operation{Name: names[i]})
			continue
		}
		qf := quotaFailure(t, err)
		if len(qf.GetViolations()) != 1 {
			t.Fatalf("QuotaFailure %v; want one violation", qf)
		}
		v := qf.GetViolations()[0]
		if v.GetSubject() != "accounts/default" || !strings.Contains(v.GetDescription(), "clusters limit 5: 5 in use, 1 requested") {
			t.Errorf("violation = %v; want accounts/default, clusters limit 5: 5 in use, 1 requested", v)
		}
	}
	if accepted != 5 {
		t.Fatalf("%d creates accepted against a limit of 5", accepted)
	}
	q, err := clv1.NewQuotasClient(hs[1].conn).GetQuota(tctx(t), &clv1.GetQuotaRequest{Name: "accounts/default/quota"})
	if err != nil || q.GetUsage().GetClusters() != 5 || q.GetUsage().GetNodes() != 10 || q.GetLimits().GetClusters() != 5 || q.GetExplicit() {
		t.Fatalf("GetQuota = %v, %v; want 5 clusters, 10 nodes, default limit 5", q, err)
	}
}

// TestQuotaAPI: who may read and set quotas, over gRPC and REST, and what
// a set limit refuses (a create, a scale up), with its metrics.
func TestQuotaAPI(t *testing.T) {
	h := start(t, repotest.Backends(t)[0], withTokens(t))
	bare := func(token string) clv1.QuotasClient {
		conn, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(withBearer(token)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return clv1.NewQuotasClient(conn)
	}
	user, admin := bare(tokenA), clv1.NewQuotasClient(h.conn)
	ctx := tctx(t)

	got, err := user.GetQuota(ctx, &clv1.GetQuotaRequest{Name: "accounts/team-a/quota"})
	if err != nil || got.GetExplicit() || got.GetLimits().Clusters != nil || got.GetUsage().GetClusters() != 0 {
		t.Fatalf("a user's own quota = %v, %v; want the default (unlimited), nothing used", got, err)
	}
	if _, err := user.GetQuota(ctx, &clv1.GetQuotaRequest{Name: "accounts/team-b/quota"}); status.Code(err) != codes.NotFound {
		t.Errorf("a user's GetQuota of another account: %v; want NOT_FOUND", err)
	}
	set := &clv1.UpdateQuotaRequest{
		Quota:      &clv1.Quota{Name: "accounts/team-a/quota", Limits: &clv1.QuotaLimits{Clusters: ptr(int64(1)), Nodes: ptr(int64(4))}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"limits.clusters", "limits.nodes"}},
	}
	if _, err := user.UpdateQuota(ctx, set); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a user's UpdateQuota: %v; want PERMISSION_DENIED", err)
	}
	if _, err := user.ListQuotas(ctx, &clv1.ListQuotasRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a user's ListQuotas: %v; want PERMISSION_DENIED", err)
	}
	got, err = admin.UpdateQuota(ctx, set)
	if err != nil || !got.GetExplicit() || got.GetLimits().GetClusters() != 1 || got.GetLimits().GetNodes() != 4 || got.GetLimits().Cpus != nil {
		t.Fatalf("admin's UpdateQuota = %v, %v", got, err)
	}

	// team-a's user creates within its quota, then past it.
	clusters := clv1.NewClusterLifecycleClient(bareConn(t, h))
	create := func(name string) error {
		op, err := clusters.CreateCluster(bearerContext(ctx, tokenA), &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: name, KubernetesVersion: "1.30.2", WorkerNodeCount: 2, ServiceOffering: "medium",
		}})
		if err == nil {
			h.wait(t, op)
		}
		return err
	}
	if err := create("one"); err != nil {
		t.Fatal(err)
	}
	if qf := quotaFailure(t, create("two")); qf.GetViolations()[0].GetSubject() != "accounts/team-a" {
		t.Errorf("QuotaFailure = %v", qf)
	}
	list, err := clusters.ListClusters(bearerContext(ctx, tokenA), &clv1.ListClustersRequest{})
	if err != nil || len(list.GetClusters()) != 1 {
		t.Fatalf("ListClusters = %v, %v", list, err)
	}
	// 1 control + 2 workers, scaling to 4 workers: 5 nodes > 4.
	w := int32(4)
	_, err = clusters.ScaleCluster(bearerContext(ctx, tokenA), &clv1.ScaleClusterRequest{Name: list.GetClusters()[0].GetName(), WorkerNodeCount: &w})
	qf := quotaFailure(t, err)
	if d := qf.GetViolations()[0].GetDescription(); d != "nodes limit 4: 3 in use, 2 requested" {
		t.Errorf("scale up refused with %q", d)
	}

	// REST: the admin reads and patches (the gateway makes the update mask
	// of the fields the body names).
	rest := func(method, path, body string) (int, map[string]any) {
		req, err := http.NewRequestWithContext(ctx, method, h.base+path, bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tokenAdmin)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}
	code, body := rest(http.MethodGet, "/v1/accounts/team-a/quota", "")
	if code != http.StatusOK || body["usage"].(map[string]any)["nodes"] != "3" {
		t.Errorf("GET quota: %d %v", code, body)
	}
	code, body = rest(http.MethodPatch, "/v1/accounts/team-a/quota", `{"limits":{"nodes":"10"}}`)
	if code != http.StatusOK || body["limits"].(map[string]any)["nodes"] != "10" || body["limits"].(map[string]any)["clusters"] != "1" {
		t.Errorf("PATCH quota: %d %v", code, body)
	}

	metrics := series(t, mustScrapeAs(t, h, "Bearer "+tokenAdmin))
	for s, want := range map[string]float64{
		`clusterd_quota_usage{account="team-a",resource="clusters"}`:     1,
		`clusterd_quota_usage{account="team-a",resource="memory_bytes"}`: 3 * 2048 << 20,
		`clusterd_quota_limit{account="team-a",resource="nodes"}`:        10,
	} {
		if metrics[s] != want {
			t.Errorf("%s = %v; want %v", s, metrics[s], want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// mustScrapeAs reads /metrics with an Authorization header.
func mustScrapeAs(t *testing.T, h *harness, authorization string) string {
	t.Helper()
	code, body, _ := h.scrape(t, authorization)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	return body
}

// TestQuotaAddNodesAndOfferingChange: AddNodes and an offering change are
// held to the quota too; a scale down is not, and frees what it held when
// it ends.
func TestQuotaAddNodesAndOfferingChange(t *testing.T) {
	limits, err := service.ParseQuota("nodes=3,cpus=6")
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, repotest.Backends(t)[0], func(c *Config) { c.DefaultQuota = limits })
	ctx := tctx(t)
	c := h.create(t, "web", 2) // 1 control + 2 medium workers: 3 nodes, 6 vCPUs
	ext := fxExternal(t, h)
	_, err = h.clients.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: c.GetName(), Machines: []string{ext.GetName()}})
	if d := quotaFailure(t, err).GetViolations(); len(d) != 2 || d[0].GetDescription() != "nodes limit 3: 3 in use, 1 requested" ||
		d[1].GetDescription() != "cpus limit 6: 6 in use, 2 requested" {
		t.Errorf("AddNodes refused with %v", d)
	}
	_, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), ServiceOffering: "large"})
	if d := quotaFailure(t, err).GetViolations(); len(d) != 1 || d[0].GetDescription() != "cpus limit 6: 6 in use, 6 requested" {
		t.Errorf("offering change refused with %v", d)
	}
	one := int32(1)
	op, err := h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: &one})
	if err != nil {
		t.Fatalf("scale down above nothing: %v", err)
	}
	h.wait(t, op)
	q, err := clv1.NewQuotasClient(h.conn).GetQuota(ctx, &clv1.GetQuotaRequest{Name: "accounts/-/quota"})
	if err != nil || q.GetName() != "accounts/default/quota" || q.GetUsage().GetNodes() != 2 || q.GetUsage().GetCpus() != 4 {
		t.Fatalf("GetQuota after the scale down = %v, %v; want 2 nodes, 4 vCPUs", q, err)
	}
	// Now the node fits.
	op, err = h.clients.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: c.GetName(), Machines: []string{ext.GetName()}})
	if err != nil {
		t.Fatalf("AddNodes within the quota: %v", err)
	}
	if done := h.wait(t, op); done.GetError() != nil {
		t.Fatalf("AddNodes failed: %v", done.GetError())
	}
}
