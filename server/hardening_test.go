package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// rawCodec sends a request's wire bytes as they are, so a test can send
// what a well-behaved client library refuses to encode (invalid UTF-8).
type rawCodec struct{}

type rawRequest []byte

func (rawCodec) Marshal(v any) ([]byte, error) {
	if r, ok := v.(rawRequest); ok {
		return r, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

// wireString appends field num holding s (any bytes) to b.
func wireString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// TestHardening_NonUTF8OverGRPC: a request with a string that is not UTF-8
// is INVALID_ARGUMENT naming the field (gRPC would answer INTERNAL), after
// authentication, and changes nothing.
func TestHardening_NonUTF8OverGRPC(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		c := h.newFixture(t, 1)
		cluster := wireString(nil, 2, "bad\xffname")
		cluster = wireString(cluster, 6, "1.30.2")
		create := protowire.AppendTag(nil, 1, protowire.BytesType)
		create = protowire.AppendBytes(create, cluster)
		scale := wireString(nil, 1, c.cluster)
		scale = wireString(scale, 3, c.worker)
		scale = wireString(scale, 3, "machines/\xc3\x28")
		for _, tc := range []struct {
			name, method string
			raw          []byte
			field        string
		}{
			{"display name", "/clusterlifecycle.v1.ClusterLifecycle/CreateCluster", create, "cluster.display_name"},
			{"filter", "/clusterlifecycle.v1.ClusterLifecycle/ListClusters", wireString(nil, 3, "state = \xff"), "filter"},
			{"second remove_nodes entry", "/clusterlifecycle.v1.ClusterLifecycle/ScaleCluster", scale, "remove_nodes[1]"},
			{"operation name", "/google.longrunning.Operations/GetOperation", wireString(nil, 1, "operations/\xfe"), "name"},
			{"broken wire data", "/clusterlifecycle.v1.ClusterLifecycle/GetCluster", []byte{0x0a, 0xff, 0xff}, "request"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := vSnapshot(t, h)
				var reply longrunningpb.Operation
				err := h.conn.Invoke(tctx(t), tc.method, rawRequest(tc.raw), &reply, grpc.ForceCodec(rawCodec{}))
				code, reason, br := errorInfo(t, err)
				if code != codes.InvalidArgument || reason != service.ReasonInvalidArgument || len(br.GetFieldViolations()) != 1 || br.GetFieldViolations()[0].GetField() != tc.field {
					t.Errorf("got %v %s %v (%v); want INVALID_ARGUMENT on %s", code, reason, br, err, tc.field)
				}
				if d := vDiff(before, vSnapshot(t, h)); d != "" {
					t.Errorf("changed the world:\n%s", d)
				}
			})
		}
		// The same undecodable request without valid credentials is
		// refused as unauthenticated first.
		anon := bareConn(t, h)
		var reply longrunningpb.Operation
		err := anon.Invoke(tctx(t), "/clusterlifecycle.v1.ClusterLifecycle/CreateCluster", rawRequest(create), &reply, grpc.ForceCodec(rawCodec{}))
		if code, _ := codeOf(t, err); code != codes.Unauthenticated {
			t.Errorf("undecodable request without credentials: %v; want UNAUTHENTICATED", code)
		}
	})
}

// restCall sends a REST request with team-a's token and returns the HTTP
// status and the decoded google.rpc.Status (or answer).
func restCall(t *testing.T, h *harness, method, path string, body io.Reader, headers ...string) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), method, h.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tokenA)
	for i := 0; i < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d, body is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out, resp.Header
}

// TestHardening_REST: what the gateway would pass on leniently is refused
// with a google.rpc.Status carrying ErrorInfo, and changes nothing.
func TestHardening_REST(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		fx := h.newFixture(t, 1)
		c := fxGet(t, h, fx.cluster)
		stop := "/v1/" + fx.cluster + ":stop"
		big := `{"etag":"` + strings.Repeat("1", maxRESTBody) + `"}`
		for _, tc := range []struct {
			name, method, path string
			body               io.Reader
			headers            []string
			status             int
			reason             string
		}{
			{"unknown JSON field (a typo of etag)", "POST", stop, strings.NewReader(`{"etagg":"` + c.GetEtag() + `"}`), nil, 400, service.ReasonInvalidArgument},
			{"unknown query parameter", "GET", "/v1/clusters?pageSizee=1", nil, nil, 400, service.ReasonInvalidArgument},
			{"query parameter on a body route", "POST", stop + "?etag=1", strings.NewReader(`{}`), nil, 400, service.ReasonInvalidArgument},
			{"query parameter naming a path field", "DELETE", "/v1/" + fx.cluster + "?name=clusters/0192f0c1-7a3e-7000-8000-000000000000", nil, nil, 400, service.ReasonInvalidArgument},
			{"data after the JSON body", "POST", stop, strings.NewReader(`{"etag":"1"} {"etag":"2"}`), nil, 400, service.ReasonInvalidArgument},
			{"garbage after the JSON body", "POST", stop, strings.NewReader(`{} x`), nil, 400, service.ReasonInvalidArgument},
			{"malformed JSON", "POST", "/v1/" + fx.cluster + ":scale", strings.NewReader(`{"workerNodeCount": 3`), nil, 400, service.ReasonInvalidArgument},
			{"wrong JSON type", "POST", "/v1/" + fx.cluster + ":scale", strings.NewReader(`{"workerNodeCount": "three"}`), nil, 400, service.ReasonInvalidArgument},
			{"body over the limit", "POST", stop, strings.NewReader(big), nil, 413, service.ReasonRequestTooLarge},
			{"chunked body over the limit", "POST", stop, io.MultiReader(strings.NewReader(big)), nil, 413, service.ReasonRequestTooLarge},
			{"no such route", "GET", "/v2/nothing", nil, nil, 404, service.ReasonNotFound},
			{"wrong method", "PUT", "/v1/clusters", strings.NewReader(`{}`), nil, 405, service.ReasonMethodNotAllowed},
			{"wrong method on openapi.json", "POST", "/openapi.json", strings.NewReader(`{}`), nil, 405, service.ReasonMethodNotAllowed},
			{"non-UTF-8 path", "GET", "/v1/clusters/%FF", nil, nil, 400, service.ReasonInvalidArgument},
			{"non-UTF-8 query", "GET", "/v1/clusters?filter=%FF", nil, nil, 400, service.ReasonInvalidArgument},
			{"non-UTF-8 header", "GET", "/v1/clusters", nil, []string{"X-Clusterd-Account", "team-\xff"}, 400, service.ReasonInvalidArgument},
			{"non-UTF-8 in the JSON body", "POST", "/v1/" + fx.cluster + ":upgrade", strings.NewReader("{\"kubernetesVersion\":\"1.30.\xff\"}"), nil, 400, service.ReasonInvalidArgument},
			{"unparsable query", "GET", "/v1/clusters?filter=%zz", nil, nil, 400, service.ReasonInvalidArgument},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := vSnapshot(t, h)
				code, out, _ := restCall(t, h, tc.method, tc.path, tc.body, tc.headers...)
				info := vDetail(out, "google.rpc.ErrorInfo")
				if code != tc.status || info == nil || info["reason"] != tc.reason || info["domain"] != service.Domain {
					t.Errorf("%s %s: %d %v; want %d with ErrorInfo %s", tc.method, tc.path, code, out, tc.status, tc.reason)
				}
				if msg, _ := out["message"].(string); len(msg) > 400 {
					t.Errorf("error message of %d bytes: an invalid value must be quoted by a short prefix only", len(msg))
				}
				if d := vDiff(before, vSnapshot(t, h)); d != "" {
					t.Errorf("changed the world:\n%s", d)
				}
			})
		}
		// Every route that takes no query parameter refuses one, whatever
		// its body: the gateway would ignore it.
		routes, err := queryFreeRoutes()
		if err != nil || len(routes) < 10 {
			t.Fatalf("routes without query parameters: %d, %v", len(routes), err)
		}
		for route := range routes {
			method, path, _ := strings.Cut(route, " ")
			path = strings.ReplaceAll(path, "*", "0192f0c1-7a3e-7000-8000-000000000000") + "?x=1"
			before := vSnapshot(t, h)
			code, out, _ := restCall(t, h, method, path, strings.NewReader("{}"), "Authorization", "Bearer "+tokenAdmin)
			if info := vDetail(out, "google.rpc.ErrorInfo"); code != http.StatusBadRequest || info == nil || info["reason"] != service.ReasonInvalidArgument {
				t.Errorf("%s %s: %d %v; want 400 INVALID_ARGUMENT", method, path, code, out)
			}
			if d := vDiff(before, vSnapshot(t, h)); d != "" {
				t.Errorf("%s %s changed the world:\n%s", method, path, d)
			}
		}
		// The typo'd conditional stop really was refused: the right field works.
		code, out, _ := restCall(t, h, "POST", stop, strings.NewReader(`{"etag":"`+c.GetEtag()+`"}`))
		if code != http.StatusOK {
			t.Fatalf("stop with the current etag: %d %v", code, out)
		}
		h.wait(t, &longrunningpb.Operation{Name: out["name"].(string)})
	})
}

// TestHardening_Bounds: counts that would overflow int32 sums, lists longer
// than a cluster can be, and long strings are refused up front with a short
// message, and change nothing.
func TestHardening_Bounds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, vCatalog)
		c := h.create(t, "web", 2)
		cs := h.clients.clusters
		const huge = 2147483647
		names := func(n int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = "machines/" + uuid.NewString()
			}
			return out
		}
		longName := strings.Repeat("x", 100_000)
		vRun(t, h, []vCase{
			{"create with the largest int32 of workers", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.CreateCluster(ctx, vCreateReq(func(c *clv1.Cluster) { c.WorkerNodeCount = huge }))
			}, []string{"cluster.worker_node_count"}},
			{"create with the largest int32 of control nodes", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.CreateCluster(ctx, vCreateReq(func(c *clv1.Cluster) { c.ControlNodeCount = huge }))
			}, []string{"cluster.control_node_count"}},
			{"create with the largest int32 as autoscaling max", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.CreateCluster(ctx, vCreateReq(func(c *clv1.Cluster) {
					c.Autoscaling = &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: huge}
				}))
			}, []string{"cluster.autoscaling.max_size"}},
			{"scale to the largest int32", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(huge))})
			}, []string{"worker_node_count"}},
			{"autoscale to the largest int32", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), Autoscaling: &clv1.Autoscaling{Enabled: true, MinSize: 1, MaxSize: huge}})
			}, []string{"autoscaling.max_size"}},
			{"remove_nodes longer than a cluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: new(int32(1)), RemoveNodes: names(6)})
			}, []string{"remove_nodes"}},
			{"AddNodes longer than a cluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.AddNodes(ctx, &clv1.AddNodesRequest{Name: c.GetName(), Machines: names(6)})
			}, []string{"machines"}},
			{"RemoveNodes longer than a cluster", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: c.GetName(), Nodes: names(6)})
			}, []string{"nodes"}},
			{"a 100 kB display name", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.CreateCluster(ctx, vCreateReq(func(c *clv1.Cluster) { c.DisplayName = longName }))
			}, []string{"cluster.display_name"}},
			{"a 100 kB cluster name", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: "clusters/" + longName})
			}, []string{"name"}},
			{"a 100 kB etag", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName(), Etag: longName})
			}, []string{"etag"}},
			{"a 100 kB request id", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.StopCluster(ctx, &clv1.StopClusterRequest{Name: c.GetName(), RequestId: longName})
			}, []string{"request_id"}},
			{"a 100 kB version", func(ctx context.Context) (*longrunningpb.Operation, error) {
				return cs.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: c.GetName(), KubernetesVersion: longName})
			}, []string{"kubernetes_version"}},
		})
		for _, tc := range []struct {
			name  string
			call  func(ctx context.Context) error
			field string
		}{
			{"a 2 kB filter", func(ctx context.Context) error {
				_, err := cs.ListClusters(ctx, &clv1.ListClustersRequest{Filter: "display_name = " + strings.Repeat("a", 2000)})
				return err
			}, "filter"},
			{"a 1 kB page token", func(ctx context.Context) error {
				_, err := cs.ListClusters(ctx, &clv1.ListClustersRequest{PageToken: strings.Repeat("A", 1000)})
				return err
			}, "page_token"},
			{"a 100 kB operation filter", func(ctx context.Context) error {
				_, err := h.clients.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Filter: "done = " + longName})
				return err
			}, "filter"},
		} {
			err := tc.call(tctx(t))
			code, _, fields := vFields(t, err)
			if code != codes.InvalidArgument || len(fields) != 1 || fields[0] != tc.field {
				t.Errorf("%s: %v %v; want INVALID_ARGUMENT on %s", tc.name, code, fields, tc.field)
			}
		}
		// Every refusal above quoted at most a prefix of the long value.
		_, err := cs.CreateCluster(tctx(t), vCreateReq(func(c *clv1.Cluster) { c.DisplayName = longName }))
		if msg := status.Convert(err).Message(); len(msg) > 400 || !strings.Contains(msg, fmt.Sprintf("(%d bytes)", len(longName))) {
			t.Errorf("the message quotes %d bytes of a %d-byte name: %.200q", len(msg), len(longName), msg)
		}
	})
}

// TestHardening_RequestIDs: a request id is compared in canonical form,
// bound to its request's parameters, and a key within one account only.
func TestHardening_RequestIDs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, withTokens(t))
		ctxA, ctxB := bearerContext(tctx(t), tokenA), bearerContext(tctx(t), tokenB)
		id := uuid.NewString()
		req := func(name string, workers int32, id string) *clv1.CreateClusterRequest {
			return &clv1.CreateClusterRequest{RequestId: id, Cluster: fxCluster(name, workers)}
		}
		first, err := h.clients.clusters.CreateCluster(ctxA, req("web", 1, id))
		if err != nil {
			t.Fatal(err)
		}
		again, err := h.clients.clusters.CreateCluster(ctxA, req("web", 1, strings.ToUpper(id)))
		if err != nil || again.GetName() != first.GetName() {
			t.Errorf("the same request with the id in upper case: %s, %v; want %s", again.GetName(), err, first.GetName())
		}
		h.wait(t, first)
		before := vSnapshot(t, h)
		_, err = h.clients.clusters.CreateCluster(ctxA, req("web", 2, id))
		if code, _, fields := vFields(t, err); code != codes.InvalidArgument || len(fields) != 1 || fields[0] != "request_id" {
			t.Errorf("the id with other parameters: %v %v; want INVALID_ARGUMENT on request_id", code, fields)
		}
		if d := vDiff(before, vSnapshot(t, h)); d != "" {
			t.Errorf("a refused reuse changed the world:\n%s", d)
		}
		inB, err := h.clients.clusters.CreateCluster(ctxB, req("web", 1, id))
		if err != nil || inB.GetName() == first.GetName() {
			t.Errorf("another account's request with the same id: %s, %v; want its own operation", inB.GetName(), err)
		}
		h.wait(t, inB)
	})
}

// bareConn is a connection to h that sends no credentials of its own.
func bareConn(t *testing.T, h *harness) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A browser's request that changes something, sent from a page of another
// site, is refused 403 (CROSS_ORIGIN_REQUEST) and changes nothing: in
// development mode such a page could otherwise stop a cluster with an
// empty POST. Reads, same-origin calls and programs (no Origin or
// Sec-Fetch-Site) are served.
func TestHardening_CrossSiteRequests(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	c := h.create(t, "web", 1)
	stop := "/v1/" + c.GetName() + ":stop"
	for _, headers := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "http://attacker.example"},
	} {
		code, body, _ := restCall(t, h, http.MethodPost, stop, nil, headers...)
		reason := ""
		if details, _ := body["details"].([]any); len(details) > 0 {
			reason, _ = details[0].(map[string]any)["reason"].(string)
		}
		if code != http.StatusForbidden || reason != service.ReasonCrossOrigin {
			t.Errorf("POST %s with %s: %d %v; want 403 %s", stop, headers, code, body, service.ReasonCrossOrigin)
		}
	}
	if got := fxGet(t, h, c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetCurrentOperation() != "" {
		t.Fatalf("after the refused cross-site stops: %s held by %q; want RUNNING, untouched", got.GetState(), got.GetCurrentOperation())
	}
	if code, body, _ := restCall(t, h, http.MethodGet, "/v1/"+c.GetName(), nil, "Sec-Fetch-Site", "cross-site"); code != http.StatusOK {
		t.Errorf("a cross-site GET: %d %v; want 200 (reads change nothing)", code, body)
	}
	code, body, _ := restCall(t, h, http.MethodPost, stop, nil, "Sec-Fetch-Site", "same-origin", "Origin", h.base)
	if code != http.StatusOK {
		t.Fatalf("a same-origin stop: %d %v; want 200", code, body)
	}
	name, _ := body["name"].(string)
	h.wait(t, &longrunningpb.Operation{Name: name})
	if code, body, _ := restCall(t, h, http.MethodPost, "/v1/"+c.GetName()+":start", nil); code != http.StatusOK {
		t.Errorf("a program's start (no Origin, no Sec-Fetch-Site): %d %v; want 200", code, body)
	}
}
