package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-openapi/loads"
	"github.com/go-openapi/spec"
	"github.com/go-openapi/strfmt"
	"github.com/go-openapi/validate"
	"google.golang.org/grpc/codes"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/gen/openapiv2"

	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// restCall sends one JSON request to the gateway and decodes the JSON answer.
func (h *harness) restCall(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var in io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		in = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(tctx(t), method, h.base+path, in)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: body is not JSON: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// openAPI fetches the document h serves at /openapi.json, raw and loaded as
// OpenAPI 2.0.
func openAPI(t *testing.T, h *harness) ([]byte, *loads.Document) {
	t.Helper()
	resp, err := http.Get(h.base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /openapi.json = %d, %v", resp.StatusCode, err)
	}
	doc, err := loads.Analyzed(json.RawMessage(raw), "2.0")
	if err != nil {
		t.Fatalf("/openapi.json does not load as OpenAPI 2.0: %v", err)
	}
	return raw, doc
}

// TestOpenAPIDocument checks the document /openapi.json serves: a valid
// OpenAPI 2.0 document with a real title and version, the Operations routes
// (WaitOperation included), and what an operation's metadata and response
// hold.
func TestOpenAPIDocument(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	_, doc := openAPI(t, h)
	if err := validate.Spec(doc, strfmt.Default); err != nil {
		t.Errorf("/openapi.json is not a valid OpenAPI 2.0 document: %v", err)
	}

	sw := doc.Spec()
	if sw.Info == nil || sw.Info.Title != "clusterd API" || sw.Info.Version != "v1" || sw.Info.Description == "" {
		t.Errorf("info = %+v; want title %q, version v1 and a description", sw.Info, "clusterd API")
	}
	routes := map[string]string{
		"GET /v1/operations":                     "Operations_ListOperations",
		"GET /v1/operations/{operation}":         "Operations_GetOperation",
		"POST /v1/operations/{operation}:cancel": "Operations_CancelOperation",
		"POST /v1/operations/{operation}:wait":   "Operations_WaitOperation",
		"POST /v1/clusters":                      "ClusterLifecycle_CreateCluster",
		"GET /v1/clusters/{cluster}":             "ClusterLifecycle_GetCluster",
	}
	for route, want := range routes {
		method, path, _ := strings.Cut(route, " ")
		op, ok := doc.Analyzer.OperationFor(method, path)
		if !ok || op.ID != want {
			t.Errorf("%s: operation %v; want %s", route, op, want)
		}
	}
	op, ok := sw.Definitions["googleLongrunningOperation"]
	if !ok {
		t.Fatal("no definition of google.longrunning.Operation")
	}
	for field, mentions := range map[string]string{
		"metadata": "clusterlifecycle.v1.OperationMetadata",
		"response": "v1Cluster",
		"error":    "ErrorInfo",
	} {
		if d := op.Properties[field].Description; !strings.Contains(d, mentions) {
			t.Errorf("Operation.%s is documented as %q; want it to name %s", field, d, mentions)
		}
	}
	if _, ok := sw.Definitions["v1Cluster"]; !ok {
		t.Error("no definition of Cluster, which a done operation's response holds")
	}
}

// TestOpenAPIValidator validates /openapi.json with @apidevtools/swagger-parser
// (tools/openapi-validator), the validator client generators such as
// swagger-typescript-api rely on, beside go-openapi's in TestOpenAPIDocument.
// Without node or the validator's node_modules the test is skipped, or fails
// under CI (make test installs it: make openapi-validator).
func TestOpenAPIValidator(t *testing.T) {
	script, err := filepath.Abs(filepath.Join("..", "tools", "openapi-validator", "validate.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "@apidevtools", "swagger-parser"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the OpenAPI validator is not installed (make openapi-validator installs it): %v", err)
		}
		t.Skipf("the OpenAPI validator is not installed: /openapi.json is not checked with swagger-parser (make openapi-validator installs it): %v", err)
	}
	h := start(t, repotest.Backends(t)[0])
	raw, _ := openAPI(t, h)
	doc := filepath.Join(t.TempDir(), "openapi.json")
	if err := os.WriteFile(doc, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(tctx(t), node, script, doc).CombinedOutput()
	if err != nil {
		t.Fatalf("swagger-parser refuses /openapi.json: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "valid: clusterd API v1") {
		t.Errorf("swagger-parser said %q; want it to report the document valid", out)
	}
}

// documentedErrors are the HTTP statuses every /v1 route of /openapi.json
// declares, each a google.rpc.Status: what clusterd answers with (see the
// status mapping in service.Status and the gateway's own refusals).
var documentedErrors = []int{400, 401, 403, 404, 409, 413, 415, 431, 500, 503}

// TestOpenAPIAuthAndErrors checks that /openapi.json tells a generated
// client how to authenticate and what errors look like: a bearer scheme in
// the Authorization header required on every /v1 operation, and every
// documented error status answered with the google.rpc.Status schema.
func TestOpenAPIAuthAndErrors(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	_, doc := openAPI(t, h)
	sw := doc.Spec()
	var schemes []string
	for name, scheme := range sw.SecurityDefinitions {
		if scheme.Type == "apiKey" && scheme.In == "header" && scheme.Name == "Authorization" && strings.Contains(scheme.Description, "Bearer") {
			schemes = append(schemes, name)
		}
	}
	if len(schemes) != 1 {
		t.Fatalf("securityDefinitions = %+v; want one bearer scheme in the Authorization header", sw.SecurityDefinitions)
	}
	bearer := schemes[0]
	for _, def := range []string{"rpcStatus", "rpcErrorInfo", "rpcBadRequest", "BadRequestFieldViolation"} {
		if _, ok := sw.Definitions[def]; !ok {
			t.Errorf("no definition %s: a generated client has no type for the errors' details", def)
		}
	}

	ops := 0
	for path, item := range sw.Paths.Paths {
		for method, op := range map[string]*spec.Operation{
			"GET": item.Get, "POST": item.Post, "PUT": item.Put, "PATCH": item.Patch, "DELETE": item.Delete,
		} {
			if op == nil {
				continue
			}
			ops++
			route := method + " " + path
			if !strings.HasPrefix(path, "/v1/") {
				t.Errorf("%s: a documented route outside /v1", route)
			}
			security := sw.Security
			if op.Security != nil {
				security = op.Security // an operation's own list replaces the document's
			}
			required := false
			for _, req := range security {
				_, ok := req[bearer]
				required = required || (ok && len(req) == 1)
			}
			if !required {
				t.Errorf("%s: security %v; want the %q scheme required", route, security, bearer)
			}
			if op.Responses == nil {
				t.Errorf("%s: no responses", route)
				continue
			}
			for _, code := range documentedErrors {
				r, ok := op.Responses.StatusCodeResponses[code]
				if !ok || r.Schema == nil || r.Schema.Ref.String() != "#/definitions/rpcStatus" || r.Description == "" {
					t.Errorf("%s: response %d is missing, undescribed or not the schema #/definitions/rpcStatus", route, code)
				}
			}
		}
	}
	if ops < 20 {
		t.Errorf("%d operations in /openapi.json; want every ClusterLifecycle, Operations and Simulator route", ops)
	}
}

// TestRESTErrorBody checks the JSON of a REST error with a BadRequest: the
// google.rpc.Status's code, message and details, the ErrorInfo with its
// (empty) metadata, and field violations that leave out what is unset
// instead of writing it as null ("localizedMessage": null); every field the
// details hold is a property of their /openapi.json definitions.
func TestRESTErrorBody(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	req, err := http.NewRequestWithContext(tctx(t), http.MethodPost, h.base+"/v1/clusters",
		strings.NewReader(`{"displayName":"Bad_Name","kubernetesVersion":"1.30.2","workerNodeCount":3,"serviceOffering":"medium"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("POST /v1/clusters with a bad name = %d %s, %v; want 400", resp.StatusCode, raw, err)
	}
	if bytes.Contains(raw, []byte("null")) {
		t.Errorf("the error body has a null: %s", raw)
	}
	var body struct {
		Code    int               `json:"code"`
		Message string            `json:"message"`
		Details []json.RawMessage `json:"details"`
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatalf("the error body is not a JSON object: %v: %s", err, raw)
	}
	if err := json.Unmarshal(raw, &body); err != nil || len(top) != 3 || body.Code != int(codes.InvalidArgument) || body.Message == "" {
		t.Fatalf("the error body = %s (%v); want exactly code 3, a message and details", raw, err)
	}
	var doc struct {
		Definitions map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal(openapiv2.JSON, &doc); err != nil {
		t.Fatal(err)
	}
	// documented fails the test unless /openapi.json's definition def has
	// every field the server wrote in obj (but @type, the Any's).
	documented := func(def string, obj map[string]json.RawMessage) {
		props := doc.Definitions[def].Properties
		for k := range obj {
			if _, ok := props[k]; !ok && k != "@type" {
				t.Errorf("the error body has %q in a %s; /openapi.json's %s has no such property", k, def, def)
			}
		}
	}
	var sawInfo, sawViolation bool
	for _, d := range body.Details {
		var detail map[string]json.RawMessage
		if err := json.Unmarshal(d, &detail); err != nil {
			t.Fatalf("detail %s: %v", d, err)
		}
		switch string(detail["@type"]) {
		case `"type.googleapis.com/google.rpc.ErrorInfo"`:
			documented("rpcErrorInfo", detail)
			sawInfo = string(detail["reason"]) == `"INVALID_ARGUMENT"` && string(detail["domain"]) == `"clusterd.dev"` && string(detail["metadata"]) == "{}"
		case `"type.googleapis.com/google.rpc.BadRequest"`:
			var br struct {
				FieldViolations []map[string]json.RawMessage `json:"fieldViolations"`
			}
			if err := json.Unmarshal(d, &br); err != nil || len(br.FieldViolations) != 1 {
				t.Fatalf("BadRequest %s: %v; want one field violation", d, err)
			}
			documented("rpcBadRequest", detail)
			v := br.FieldViolations[0]
			documented("BadRequestFieldViolation", v)
			_, hasLocalized := v["localizedMessage"]
			sawViolation = string(v["field"]) == `"cluster.display_name"` && len(v["description"]) > 2 && !hasLocalized
		}
	}
	if !sawInfo || !sawViolation {
		t.Errorf("details = %s; want an ErrorInfo (INVALID_ARGUMENT, clusterd.dev, metadata {}) and a BadRequest on cluster.display_name without localizedMessage", raw)
	}
}

// TestRESTWaitOperation follows an operation over REST only: create, wait
// with a short timeout while a step is held (not done), then wait until done
// once it is released; the metadata and the response decode as documented.
func TestRESTWaitOperation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		fault, err := h.srv.sim.InjectFault(sim.Fault{Step: "join_node", Mode: sim.ModeHold, Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		code, op := h.restCall(t, "POST", "/v1/clusters", map[string]any{
			"displayName": "rest-wait", "kubernetesVersion": "1.30.2", "workerNodeCount": 1, "serviceOffering": "medium",
		})
		name, _ := op["name"].(string)
		if code != http.StatusOK || !strings.HasPrefix(name, "operations/") {
			t.Fatalf("POST /v1/clusters = %d %v", code, op)
		}
		if _, err := h.srv.sim.WaitHeld(tctx(t), func(held sim.Held) bool { return held.FaultID == fault.ID }); err != nil {
			t.Fatalf("join_node never held: %v", err)
		}

		code, waited := h.restCall(t, "POST", "/v1/"+name+":wait", map[string]any{"timeout": "0.2s"})
		if code != http.StatusOK || waited["done"] == true || waited["name"] != name {
			t.Errorf("wait while held = %d %v; want 200, not done", code, waited)
		}
		md, _ := waited["metadata"].(map[string]any)
		if md["@type"] != "type.googleapis.com/clusterlifecycle.v1.OperationMetadata" || md["verb"] != "create" || md["step"] != "join_node" {
			t.Errorf("metadata while held = %v; want a create's OperationMetadata at join_node", md)
		}

		if _, err := h.srv.sim.ReleaseHeld(fault.ID); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for waited["done"] != true && time.Now().Before(deadline) {
			code, waited = h.restCall(t, "POST", "/v1/"+name+":wait", map[string]any{"timeout": "10s"})
			if code != http.StatusOK {
				t.Fatalf("wait = %d %v", code, waited)
			}
		}
		cluster, _ := waited["response"].(map[string]any)
		if waited["done"] != true || cluster["@type"] != "type.googleapis.com/clusterlifecycle.v1.Cluster" || cluster["state"] != "RUNNING" {
			t.Fatalf("waited operation = %v; want done with the RUNNING cluster", waited)
		}

		code, got := h.restCall(t, "GET", "/v1/"+name, nil)
		if code != http.StatusOK || got["done"] != true {
			t.Errorf("GET /v1/%s = %d %v", name, code, got)
		}
		code, _ = h.restCall(t, "POST", "/v1/"+name+":cancel", map[string]any{})
		if code != http.StatusOK {
			t.Errorf("cancel of a done operation = %d; want 200 (a no-op)", code)
		}
		code, bad := h.restCall(t, "POST", "/v1/operations/not-a-uuid:wait", map[string]any{})
		if code != http.StatusBadRequest || !strings.Contains(fmtJSON(bad), "INVALID_ARGUMENT") {
			t.Errorf("wait on a malformed name = %d %v; want 400 INVALID_ARGUMENT", code, bad)
		}
	})
}

func fmtJSON(v any) string {
	raw, _ := json.Marshal(v)
	return string(raw)
}

// TestListFilters lists through the API with AIP-160 filters: OR, NOT,
// parentheses, times, and a precise INVALID_ARGUMENT for a mistake.
func TestListFilters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b)
		ctx := tctx(t)
		web := h.seedRunning(t, "web")
		db := h.seedRunning(t, "db")
		h.seedRunning(t, "cache")
		if _, err := h.seed.Transition(ctx, repository.Transition{ClusterID: db.ID, Expect: db.Expect(), Event: lifecycle.StopRequested, Operation: "op"}); err != nil {
			t.Fatal(err)
		}
		stopping, _ := h.seed.GetCluster(ctx, db.ID)
		if _, err := h.seed.Transition(ctx, repository.Transition{ClusterID: db.ID, Expect: stopping.Expect(), Event: lifecycle.OperationSucceeded}); err != nil {
			t.Fatal(err)
		}
		names := func(filter string) []string {
			t.Helper()
			resp, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{Filter: filter})
			if err != nil {
				t.Fatalf("ListClusters(%q): %v", filter, err)
			}
			var out []string
			for _, c := range resp.GetClusters() {
				out = append(out, c.GetDisplayName())
			}
			return out
		}
		since := web.CreateTime.Format(time.RFC3339Nano)
		for filter, want := range map[string][]string{
			"state = RUNNING OR state = STOPPED":                             {"web", "db", "cache"},
			"state = STOPPED OR display_name = cache":                        {"db", "cache"},
			"NOT state = STOPPED":                                            {"web", "cache"},
			`(display_name = web OR display_name = db) AND state != RUNNING`: {"db"},
			`create_time > "` + since + `"`:                                  {"db", "cache"},
			`create_time > "` + since + `" AND -display_name = db`:           {"cache"},
		} {
			if got := names(filter); !slices.Equal(got, want) {
				t.Errorf("filter %q = %v; want %v", filter, got, want)
			}
		}

		_, err := h.clients.clusters.ListClusters(ctx, &clv1.ListClustersRequest{Filter: "state = RUNNING OR state = SIDEWAYS"})
		code, reason, br := errorInfo(t, err)
		if code != codes.InvalidArgument || reason != "INVALID_ARGUMENT" || br == nil || br.GetFieldViolations()[0].GetField() != "filter" ||
			!strings.Contains(br.GetFieldViolations()[0].GetDescription(), `"SIDEWAYS" is not a state`) ||
			!strings.Contains(br.GetFieldViolations()[0].GetDescription(), "column 28") {
			t.Errorf("bad state in a filter: %v %s %v; want INVALID_ARGUMENT on filter naming SIDEWAYS at column 28", code, reason, br)
		}

		status, body := h.restCall(t, "GET", "/v1/operations?filter="+url.QueryEscape(`verb = create AND (done = true OR cluster = "clusters/`+web.ID+`")`), nil)
		if ops, _ := body["operations"].([]any); status != http.StatusOK || len(ops) != 3 {
			t.Errorf("GET /v1/operations with an OR filter = %d %v; want the 3 creates", status, body)
		}
	})
}
