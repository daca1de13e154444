package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// catalogCall is one Catalog RPC, over gRPC and over REST.
type catalogCall struct {
	rpc   string
	write bool
	grpc  func(ctx context.Context, c clv1.CatalogClient) error
	// method, path and JSON body of the REST request.
	rest func() (string, string, string)
}

func catalogCalls(n int) []catalogCall {
	v := fmt.Sprintf("2.0.%d", n)
	o := fmt.Sprintf("size-%d", n)
	mask := func(p ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: p} }
	return []catalogCall{
		{"ListKubernetesVersions", false, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.ListKubernetesVersions(ctx, &clv1.ListKubernetesVersionsRequest{})
			return err
		}, func() (string, string, string) { return "GET", "/v1/kubernetesVersions", "" }},
		{"GetKubernetesVersion", false, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.GetKubernetesVersion(ctx, &clv1.GetKubernetesVersionRequest{Name: "kubernetesVersions/1.30.2"})
			return err
		}, func() (string, string, string) { return "GET", "/v1/kubernetesVersions/1.30.2", "" }},
		{"CreateKubernetesVersion", true, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.CreateKubernetesVersion(ctx, &clv1.CreateKubernetesVersionRequest{KubernetesVersionId: v, KubernetesVersion: &clv1.KubernetesVersion{MinCpus: 2}})
			return err
		}, func() (string, string, string) {
			return "POST", "/v1/kubernetesVersions?kubernetesVersionId=" + v, `{"minCpus":2}`
		}},
		{"UpdateKubernetesVersion", true, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.UpdateKubernetesVersion(ctx, &clv1.UpdateKubernetesVersionRequest{
				KubernetesVersion: &clv1.KubernetesVersion{Name: "kubernetesVersions/" + v, State: clv1.CatalogState_DISABLED}, UpdateMask: mask("state")})
			return err
		}, func() (string, string, string) {
			return "PATCH", "/v1/kubernetesVersions/" + v, `{"state":"DISABLED"}`
		}},
		{"DeleteKubernetesVersion", true, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.DeleteKubernetesVersion(ctx, &clv1.DeleteKubernetesVersionRequest{Name: "kubernetesVersions/" + v})
			return err
		}, func() (string, string, string) { return "DELETE", "/v1/kubernetesVersions/" + v, "" }},
		{"ListServiceOfferings", false, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.ListServiceOfferings(ctx, &clv1.ListServiceOfferingsRequest{})
			return err
		}, func() (string, string, string) { return "GET", "/v1/serviceOfferings", "" }},
		{"GetServiceOffering", false, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.GetServiceOffering(ctx, &clv1.GetServiceOfferingRequest{Name: "serviceOfferings/medium"})
			return err
		}, func() (string, string, string) { return "GET", "/v1/serviceOfferings/medium", "" }},
		{"CreateServiceOffering", true, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.CreateServiceOffering(ctx, &clv1.CreateServiceOfferingRequest{ServiceOfferingId: o, ServiceOffering: &clv1.ServiceOffering{Cpus: 2, MemoryMb: 4096}})
			return err
		}, func() (string, string, string) {
			return "POST", "/v1/serviceOfferings?serviceOfferingId=" + o, `{"cpus":2,"memoryMb":4096}`
		}},
		{"UpdateServiceOffering", true, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.UpdateServiceOffering(ctx, &clv1.UpdateServiceOfferingRequest{
				ServiceOffering: &clv1.ServiceOffering{Name: "serviceOfferings/" + o, Description: "x"}, UpdateMask: mask("description")})
			return err
		}, func() (string, string, string) {
			return "PATCH", "/v1/serviceOfferings/" + o, `{"description":"x"}`
		}},
		{"DeleteServiceOffering", true, func(ctx context.Context, c clv1.CatalogClient) error {
			_, err := c.DeleteServiceOffering(ctx, &clv1.DeleteServiceOfferingRequest{Name: "serviceOfferings/" + o})
			return err
		}, func() (string, string, string) { return "DELETE", "/v1/serviceOfferings/" + o, "" }},
	}
}

// TestCatalog_Access calls every Catalog RPC, over gRPC and REST, as a
// user, an admin and callers without valid credentials: every
// authenticated caller reads, only admins write (PERMISSION_DENIED,
// ADMIN_REQUIRED for a user).
func TestCatalog_Access(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		bare := clv1.NewCatalogClient(bareConn(t, h))
		for n, transport := range []string{"grpc", "rest"} {
			for _, w := range []who{anonymous, wrongToken, owner, admin} {
				// The admin's writes run in order: create, update, delete.
				for _, call := range catalogCalls(n) {
					t.Run(fmt.Sprintf("%s/%s/%s", transport, call.rpc, w.name), func(t *testing.T) {
						want := codes.OK
						switch {
						case w.name == anonymous.name || w.name == wrongToken.name:
							want = codes.Unauthenticated
						case call.write && w.name != admin.name:
							want = codes.PermissionDenied
						}
						var code codes.Code
						var reason string
						if transport == "grpc" {
							err := call.grpc(metadata.AppendToOutgoingContext(tctx(t), w.headers...), bare)
							if err != nil {
								code, reason, _ = errorInfo(t, err)
							}
						} else {
							code, reason = catalogREST(t, h, call, w)
						}
						if code != want {
							t.Fatalf("%s as %s over %s: %v (%s); want %v", call.rpc, w.name, transport, code, reason, want)
						}
						if code == codes.PermissionDenied && reason != service.ReasonAdminRequired {
							t.Errorf("reason %q; want %s", reason, service.ReasonAdminRequired)
						}
					})
				}
			}
		}
	})
}

func catalogREST(t *testing.T, h *harness, call catalogCall, w who) (codes.Code, string) {
	t.Helper()
	method, path, body := call.rest()
	req, err := http.NewRequestWithContext(tctx(t), method, h.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i < len(w.headers); i += 2 {
		req.Header.Add(w.headers[i], w.headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return codes.OK, ""
	}
	var out struct {
		Code    codes.Code `json:"code"`
		Details []struct {
			Type   string `json:"@type"`
			Reason string `json:"reason"`
		} `json:"details"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: HTTP %d, body is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	t.Logf("%s %s: HTTP %d %s", method, path, resp.StatusCode, raw)
	for _, d := range out.Details {
		if strings.HasSuffix(d.Type, "ErrorInfo") {
			return out.Code, d.Reason
		}
	}
	return out.Code, ""
}

// TestCatalog_Rules: what the catalog allows clusters, through the API.
func TestCatalog_Rules(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		cat := h.clients.catalog
		refused := func(t *testing.T, what string, err error, wantCode codes.Code, wantReason string, fields ...string) {
			t.Helper()
			if err == nil {
				t.Fatalf("%s: accepted; want %v %s", what, wantCode, wantReason)
			}
			code, reason, br := errorInfo(t, err)
			if code != wantCode || reason != wantReason {
				t.Errorf("%s: %v %s (%v); want %v %s", what, code, reason, err, wantCode, wantReason)
			}
			var got []string
			for _, v := range br.GetFieldViolations() {
				got = append(got, v.GetField())
			}
			if len(fields) > 0 && !slices.Equal(got, fields) {
				t.Errorf("%s: fields %v; want %v", what, got, fields)
			}
		}

		// The flags' defaults seeded the catalog.
		vs, err := cat.ListKubernetesVersions(ctx, &clv1.ListKubernetesVersionsRequest{PageSize: 4})
		if err != nil || len(vs.GetKubernetesVersions()) != 4 || vs.GetNextPageToken() == "" || vs.GetKubernetesVersions()[0].GetVersion() != "1.28.9" {
			t.Fatalf("first page of versions = %v, %v; want 4 from 1.28.9 and a next page", vs, err)
		}
		rest, err := cat.ListKubernetesVersions(ctx, &clv1.ListKubernetesVersionsRequest{PageSize: 4, PageToken: vs.GetNextPageToken()})
		if err != nil || len(rest.GetKubernetesVersions()) != 2 || rest.GetNextPageToken() != "" || rest.GetKubernetesVersions()[1].GetVersion() != "1.31.1" {
			t.Errorf("second page of versions = %v, %v; want 1.30.5, 1.31.1", rest, err)
		}

		// A cluster with its own control offering; Get says which.
		web := fxCreate(t, h, &clv1.Cluster{DisplayName: "web", KubernetesVersion: "1.30.2", WorkerNodeCount: 1,
			ServiceOffering: "medium", ControlOffering: "large"})
		if web.GetControlOffering() != "large" || web.GetServiceOffering() != "medium" {
			t.Errorf("cluster offerings = %q control, %q workers; want large, medium", web.GetControlOffering(), web.GetServiceOffering())
		}
		plain := fxCreate(t, h, &clv1.Cluster{DisplayName: "plain", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium"})
		if plain.GetControlOffering() != "medium" {
			t.Errorf("control offering without one asked = %q; want the service offering, medium", plain.GetControlOffering())
		}
		_, err = h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{DisplayName: "tiny",
			KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium", ControlOffering: "small"}})
		refused(t, "a control offering below the version's minimum", err, codes.InvalidArgument, service.ReasonInvalidArgument, "cluster.control_offering")

		// In use: neither the version nor either offering can go.
		_, err = cat.DeleteKubernetesVersion(ctx, &clv1.DeleteKubernetesVersionRequest{Name: "kubernetesVersions/1.30.2"})
		refused(t, "delete the version of a cluster", err, codes.FailedPrecondition, service.ReasonCatalogEntryInUse)
		if err != nil && !strings.Contains(err.Error(), `"web"`) && !strings.Contains(err.Error(), `"plain"`) {
			t.Errorf("in-use refusal names no cluster: %v", err)
		}
		_, err = cat.DeleteServiceOffering(ctx, &clv1.DeleteServiceOfferingRequest{Name: "serviceOfferings/large"})
		refused(t, "delete the control offering of a cluster", err, codes.FailedPrecondition, service.ReasonCatalogEntryInUse)

		// Sizes never change.
		_, err = cat.UpdateServiceOffering(ctx, &clv1.UpdateServiceOfferingRequest{
			ServiceOffering: &clv1.ServiceOffering{Name: "serviceOfferings/large", Cpus: 64}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"cpus"}}})
		refused(t, "change an offering's size", err, codes.InvalidArgument, service.ReasonInvalidArgument, "service_offering.cpus")

		// A DISABLED version takes no new cluster and no upgrade; the
		// upgrade targets are the enabled later patch or next minor.
		if _, err := cat.UpdateKubernetesVersion(ctx, &clv1.UpdateKubernetesVersionRequest{
			KubernetesVersion: &clv1.KubernetesVersion{Name: "kubernetesVersions/1.31.1", State: clv1.CatalogState_DISABLED},
			UpdateMask:        &fieldmaskpb.FieldMask{Paths: []string{"state"}}}); err != nil {
			t.Fatal(err)
		}
		_, err = h.clients.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{DisplayName: "new",
			KubernetesVersion: "1.31.1", WorkerNodeCount: 1, ServiceOffering: "medium"}})
		refused(t, "create on a disabled version", err, codes.FailedPrecondition, service.ReasonCatalogEntryUnusable)
		_, err = h.clients.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: web.GetName(), KubernetesVersion: "1.31.1"})
		refused(t, "upgrade to a disabled version", err, codes.FailedPrecondition, service.ReasonCatalogEntryUnusable)
		targets := func() []string {
			t.Helper()
			resp, err := cat.ListKubernetesVersions(ctx, &clv1.ListKubernetesVersionsRequest{UpgradesFor: web.GetName()})
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, v := range resp.GetKubernetesVersions() {
				out = append(out, v.GetVersion())
			}
			return out
		}
		if got := targets(); !slices.Equal(got, []string{"1.30.5"}) {
			t.Errorf("upgrade targets with 1.31.1 disabled = %v; want [1.30.5]", got)
		}
		if _, err := cat.UpdateKubernetesVersion(ctx, &clv1.UpdateKubernetesVersionRequest{
			KubernetesVersion: &clv1.KubernetesVersion{Name: "kubernetesVersions/1.31.1", State: clv1.CatalogState_ENABLED},
			UpdateMask:        &fieldmaskpb.FieldMask{Paths: []string{"state"}}}); err != nil {
			t.Fatal(err)
		}
		if got := targets(); !slices.Equal(got, []string{"1.30.5", "1.31.1"}) {
			t.Errorf("upgrade targets = %v; want [1.30.5 1.31.1]", got)
		}
		// A running upgrade keeps its target from being deleted.
		hold, err := h.clients.sim.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "upgrade_node", Mode: clv1.Fault_HOLD, Cluster: web.GetName(), Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		_ = hold
		op, err := h.clients.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: web.GetName(), KubernetesVersion: "1.30.5"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cat.DeleteKubernetesVersion(ctx, &clv1.DeleteKubernetesVersionRequest{Name: "kubernetesVersions/1.30.5"})
		refused(t, "delete the target of a running upgrade", err, codes.FailedPrecondition, service.ReasonCatalogEntryInUse)
		if _, err := h.clients.sim.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{All: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.clients.sim.ClearFaults(ctx, &clv1.ClearFaultsRequest{}); err != nil {
			t.Fatal(err)
		}
		h.wait(t, op)
		// A DISABLED offering keeps its clusters scaling within it, and
		// takes no cluster onto it.
		disable := func(name string, st clv1.CatalogState) {
			t.Helper()
			if _, err := cat.UpdateServiceOffering(ctx, &clv1.UpdateServiceOfferingRequest{
				ServiceOffering: &clv1.ServiceOffering{Name: "serviceOfferings/" + name, State: st},
				UpdateMask:      &fieldmaskpb.FieldMask{Paths: []string{"state"}}}); err != nil {
				t.Fatal(err)
			}
		}
		disable("medium", clv1.CatalogState_DISABLED)
		disable("large", clv1.CatalogState_DISABLED)
		op, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: plain.GetName(), WorkerNodeCount: new(int32(2))})
		fxDone(t, h, op, err)
		_, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: plain.GetName(), ServiceOffering: "large"})
		refused(t, "scale onto a disabled offering", err, codes.FailedPrecondition, service.ReasonCatalogEntryUnusable)
		disable("large", clv1.CatalogState_ENABLED)
		op, err = h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: plain.GetName(), ServiceOffering: "large"})
		fxDone(t, h, op, err)
		_, err = cat.DeleteServiceOffering(ctx, &clv1.DeleteServiceOfferingRequest{Name: "serviceOfferings/medium"})
		refused(t, "delete the workers' offering of web", err, codes.FailedPrecondition, service.ReasonCatalogEntryInUse)

		// An unused version goes.
		if _, err := cat.DeleteKubernetesVersion(ctx, &clv1.DeleteKubernetesVersionRequest{Name: "kubernetesVersions/1.28.9"}); err != nil {
			t.Errorf("delete an unused version: %v", err)
		}
	})
}
