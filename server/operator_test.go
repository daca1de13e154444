package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/internal/syncbuf"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// scrape reads GET /metrics with the given Authorization header ("" for
// none) and returns the status and body.
func (h *harness) scrape(t *testing.T, authorization string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), http.MethodGet, h.base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

// series parses Prometheus' text format into series -> value, the series
// spelled as exposed (labels in alphabetical order).
func series(t *testing.T, body string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// waitMetrics polls /metrics (bounded) until every series reaches at least
// its value: a job's counters move just after its end is written (the
// runner's OnDone), which a client may see first, and recoveries happen in
// the background.
func (h *harness) waitMetrics(t *testing.T, atLeast map[string]float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body, _ := h.scrape(t, "")
		m := series(t, body)
		var missing []string
		for name, want := range atLeast {
			if m[name] < want {
				missing = append(missing, fmt.Sprintf("%s = %v, want at least %v", name, m[name], want))
			}
		}
		if len(missing) == 0 {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %s", strings.Join(missing, "; "))
		}
		time.Sleep(20 * time.Millisecond) // sampling counters, not synchronising
	}
}

// TestMetrics drives a cluster through a success, a failure with a repair,
// a recovery by the scanner and refused requests, and reads each of them in
// /metrics as Prometheus would (development mode: no credentials needed).
func TestMetrics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, busyScanner)
		ctx := tctx(t)
		c := h.create(t, "web", 1)

		// Refused claims: a state without the transition, then a holder.
		if _, err := h.clients.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: c.GetName()}); err == nil {
			t.Fatal("starting a RUNNING cluster was accepted")
		}
		// A scale whose new node never joins fails, and the machine it added
		// is destroyed on the way out (a repair); the cluster is ALERT, and
		// the scanner recovers it (every machine runs and has joined).
		if _, err := h.clients.sim.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{
			Step: "join_node", Mode: clv1.Fault_FAIL, Cluster: c.GetName(), Count: 1}}); err != nil {
			t.Fatal(err)
		}
		two := int32(2)
		op, err := h.clients.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: &two})
		if err != nil {
			t.Fatal(err)
		}
		if done := h.wait(t, op); done.GetError() == nil {
			t.Fatal("the scale with a failing join_node succeeded")
		}
		h.waitState(t, c.GetName(), clv1.Cluster_RUNNING)
		m := h.waitMetrics(t, map[string]float64{
			`clusterd_recoveries_total{kind="recover_alert"}`:              1,
			`clusterd_operations_total{result="succeeded",verb="recover"}`: 1,
			`clusterd_operations_total{result="failed",verb="scale"}`:      1,
			`clusterd_operations_total{result="succeeded",verb="create"}`:  1,
			// Counted when the pass that started the recovery ends, which
			// may be after the recovery itself.
			`clusterd_scanner_recovered_total`: 1,
		})

		for name, want := range map[string]float64{
			`clusterd_operations_total{result="succeeded",verb="create"}`:      1,
			`clusterd_operations_total{result="failed",verb="scale"}`:          1,
			`clusterd_operations_total{result="succeeded",verb="recover"}`:     1,
			`clusterd_operations_total{result="cancelled",verb="delete"}`:      0,
			`clusterd_operation_duration_seconds_count{verb="create"}`:         1,
			`clusterd_claims_refused_total{reason="INVALID_STATE_TRANSITION"}`: 1,
			`clusterd_claims_refused_total{reason="OPERATION_IN_PROGRESS"}`:    0,
			`clusterd_repairs_total{kind="destroy_machine"}`:                   1,
			`clusterd_clusters{state="RUNNING"}`:                               1,
			`clusterd_clusters{state="ALERT"}`:                                 0,
			`go_sql_max_open_connections{db_name="clusterd"}`:                  map[string]float64{"sqlite": 1, "mysql": 32}[b.Name],
			`clusterd_scanner_passes_total`:                                    m[`clusterd_scan_pass_duration_seconds_count`],
			`grpc_server_handled_total{grpc_code="OK",grpc_method="CreateCluster",grpc_service="clusterlifecycle.v1.ClusterLifecycle",grpc_type="unary"}`:                1,
			`grpc_server_handled_total{grpc_code="FailedPrecondition",grpc_method="StartCluster",grpc_service="clusterlifecycle.v1.ClusterLifecycle",grpc_type="unary"}`: 1,
		} {
			if got, ok := m[name]; !ok || got != want {
				t.Errorf("%s = %v (exposed: %v); want %v", name, got, ok, want)
			}
		}
		for _, name := range []string{
			`clusterd_operation_duration_seconds_bucket{verb="scale",le="+Inf"}`,
			`grpc_server_handling_seconds_bucket{grpc_method="CreateCluster",grpc_service="clusterlifecycle.v1.ClusterLifecycle",grpc_type="unary",le="+Inf"}`,
			`clusterd_scan_pass_duration_seconds_bucket{le="+Inf"}`,
			`go_sql_open_connections{db_name="clusterd"}`,
			`go_goroutines`,
		} {
			if m[name] < 1 {
				t.Errorf("%s = %v; want at least 1", name, m[name])
			}
		}
		// The lock conflicts' counters exist from the start, whatever
		// this test's writes met.
		for _, name := range []string{
			`clusterd_database_lock_conflicts_total{kind="deadlock"}`,
			`clusterd_database_lock_conflicts_total{kind="lock_wait_timeout"}`,
			`clusterd_database_lock_conflicts_total{kind="busy_snapshot"}`,
			`clusterd_database_writes_given_up_total`,
		} {
			if _, ok := m[name]; !ok {
				t.Errorf("%s not exposed", name)
			}
		}
		// The SQLite writer's batches: this test's writes ran in them (one
		// a batch, or more); MySQL has none.
		if b.Name == "sqlite" {
			if m[`clusterd_sqlite_write_batches_total`] < 1 || m[`clusterd_sqlite_batched_writes_total`] < m[`clusterd_sqlite_write_batches_total`] {
				t.Errorf("batches %v, writes in them %v; want at least one batch, and a write a batch at least",
					m[`clusterd_sqlite_write_batches_total`], m[`clusterd_sqlite_batched_writes_total`])
			}
		} else if _, ok := m[`clusterd_sqlite_write_batches_total`]; ok {
			t.Error("clusterd_sqlite_write_batches_total exposed on MySQL")
		}
		if !regexp.MustCompile(`(?m)^clusterd_build_info\{commit="[^"]+",goversion="go[^"]+",version="[^"]+"\} 1$`).MatchString(mustScrape(t, h)) {
			t.Error("clusterd_build_info is missing or unlabelled")
		}
	})
}

func mustScrape(t *testing.T, h *harness) string {
	t.Helper()
	code, body, _ := h.scrape(t, "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", code, body)
	}
	return body
}

// TestMetricsNeedAnAdmin: with identities configured, /metrics counts every
// account's clusters, so it answers admins only, with the API's errors.
func TestMetricsNeedAnAdmin(t *testing.T) {
	h := start(t, repotest.Backends(t)[0], withTokens(t))
	for _, tc := range []struct {
		who, authorization string
		code               int
		reason             string
	}{
		{"nobody", "", http.StatusUnauthorized, service.ReasonCredentialsMissing},
		{"a wrong token", "Bearer nope", http.StatusUnauthorized, service.ReasonCredentialsInvalid},
		{"a user", "Bearer " + tokenA, http.StatusForbidden, service.ReasonAdminRequired},
		{"the admin", "Bearer " + tokenAdmin, http.StatusOK, ""},
	} {
		code, body, header := h.scrape(t, tc.authorization)
		if code != tc.code {
			t.Errorf("%s: GET /metrics = %d; want %d", tc.who, code, tc.code)
			continue
		}
		if tc.reason == "" {
			if !strings.Contains(body, "clusterd_clusters{") {
				t.Errorf("%s: the metrics lack clusterd_clusters", tc.who)
			}
			continue
		}
		if !strings.Contains(body, `"reason":"`+tc.reason+`"`) || strings.Contains(body, "clusterd_") {
			t.Errorf("%s: body %s; want a google.rpc.Status with reason %s and no metrics", tc.who, body, tc.reason)
		}
		if code == http.StatusUnauthorized && header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without a WWW-Authenticate challenge", tc.who)
		}
	}
}

// logBuffer collects a server's JSON log lines.
type logBuffer struct{ syncbuf.Buffer }

// lines returns the log lines whose request_id is id.
func (l *logBuffer) lines(t *testing.T, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, raw := range bytes.Split([]byte(l.String()), []byte("\n")) {
		if len(raw) == 0 {
			continue
		}
		var line map[string]any
		if err := json.Unmarshal(raw, &line); err != nil {
			t.Fatalf("log line %q is not JSON: %v", raw, err)
		}
		if line["request_id"] == id {
			out = append(out, line)
		}
	}
	return out
}

func withJSONLog(l *logBuffer) func(*Config) {
	return func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// TestRequestIDs: every call is answered with a request id (the caller's
// when well-formed), over gRPC and REST, success or error, and the call's
// log lines carry it with the real client address; a REST client cannot
// choose the address the logs show.
func TestRequestIDs(t *testing.T) {
	var logs logBuffer
	h := start(t, repotest.Backends(t)[0], withJSONLog(&logs))
	ctx := tctx(t)
	missing := &clv1.GetClusterRequest{Name: "clusters/0192f0c1-7a3e-7000-8000-000000000000"}

	for _, tc := range []struct {
		name, sent string
		req        *clv1.GetClusterRequest
		want       *regexp.Regexp
	}{
		{"none sent, success", "", nil, uuidPattern},
		{"well-formed, kept", "trace-4bf92f3577b34da6", nil, regexp.MustCompile(`^trace-4bf92f3577b34da6$`)},
		{"malformed, replaced", "no spaces allowed", nil, uuidPattern},
		{"error answer", "err-1", missing, regexp.MustCompile(`^err-1$`)},
	} {
		callCtx := ctx
		if tc.sent != "" {
			callCtx = metadata.AppendToOutgoingContext(ctx, RequestIDHeader, tc.sent)
		}
		var header metadata.MD
		var err error
		if tc.req != nil {
			_, err = h.clients.clusters.GetCluster(callCtx, tc.req, grpc.Header(&header))
		} else {
			_, err = h.clients.clusters.ListClusters(callCtx, &clv1.ListClustersRequest{}, grpc.Header(&header))
		}
		if tc.req != nil {
			if code, _, _ := errorInfo(t, err); code != codes.NotFound {
				t.Fatalf("%s: %v", tc.name, err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		got := header.Get(RequestIDHeader)
		if len(got) != 1 || !tc.want.MatchString(got[0]) {
			t.Errorf("gRPC %s: x-request-id %v; want %v", tc.name, got, tc.want)
		}
	}

	// REST: the id is answered on API calls and on the gateway's own
	// refusals; the client's forged X-Forwarded-For does not reach the log.
	restMethod := func(method, path, id string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, method, h.base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	rest := func(path, id string) *http.Response { return restMethod(http.MethodGet, path, id) }
	if resp := rest("/v1/clusters", "rest-call-1"); resp.Header.Get("X-Request-Id") != "rest-call-1" || resp.Header.Get("Grpc-Metadata-X-Request-Id") != "" {
		t.Errorf("REST answer headers %v; want X-Request-Id: rest-call-1 once", resp.Header)
	}
	if resp := rest("/v1/nowhere", ""); resp.StatusCode != 404 || !uuidPattern.MatchString(resp.Header.Get("X-Request-Id")) {
		t.Errorf("unknown route: %d, X-Request-Id %q; want 404 with a fresh id", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	if resp := rest("/v1/clusters?pageSizee=3", "gw-refused-1"); resp.StatusCode != 400 {
		t.Errorf("unknown query parameter: %d; want 400", resp.StatusCode)
	}
	if resp := restMethod(http.MethodPut, "/v1/clusters", "gw-405"); resp.StatusCode != 405 {
		t.Errorf("wrong method: %d; want 405", resp.StatusCode)
	}
	if resp := rest("/v1/"+missing.Name, "rest-err-1"); resp.StatusCode != 404 {
		t.Errorf("missing cluster over REST: %d; want 404", resp.StatusCode)
	}

	lines := logs.lines(t, "rest-call-1")
	if len(lines) != 1 || lines[0]["grpc.method"] != "ListClusters" || lines[0]["client"] != "127.0.0.1" || lines[0]["peer.address"] != nil {
		t.Errorf("log lines of the REST call = %v; want the finished call with client 127.0.0.1 (not the forged 203.0.113.9)", lines)
	}
	// A refusal by the gateway itself is logged once, by the gateway; an
	// error answer of the gRPC server once, by the server, not again by the
	// gateway that passes it on.
	lines = logs.lines(t, "gw-refused-1")
	if len(lines) != 1 || lines[0]["msg"] != "request refused by the REST gateway" || lines[0]["grpc.code"] != "InvalidArgument" ||
		lines[0]["http.status"] != float64(400) || lines[0]["http.path"] != "/v1/clusters" || lines[0]["client"] != "127.0.0.1" {
		t.Errorf("log lines of the gateway's refusal = %v; want one line saying the gateway refused it, with status and client", lines)
	}
	lines = logs.lines(t, "gw-405")
	if len(lines) != 1 || lines[0]["level"] != "INFO" || lines[0]["http.status"] != float64(405) || lines[0]["http.method"] != "PUT" {
		t.Errorf("log lines of a wrong method = %v; want one INFO line (the client's mistake, not the server's error)", lines)
	}
	lines = logs.lines(t, "rest-err-1")
	if len(lines) != 1 || lines[0]["grpc.method"] != "GetCluster" || lines[0]["grpc.code"] != "NotFound" {
		t.Errorf("log lines of the REST call the server refused = %v; want only the server's finished call", lines)
	}
	lines = logs.lines(t, "err-1")
	if len(lines) != 1 || lines[0]["grpc.code"] != "NotFound" || !strings.HasPrefix(lines[0]["client"].(string), "127.0.0.1:") {
		t.Errorf("log lines of the gRPC call = %v; want the finished call with the client's address and port", lines)
	}
}

// TestDebugAddr: --debug-addr serves pprof; without identities only on
// loopback, with them to admins only.
func TestDebugAddr(t *testing.T) {
	b := repotest.Backends(t)[0]
	get := func(url, authorization string) (int, string) {
		req, err := http.NewRequestWithContext(tctx(t), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	h := start(t, b)
	if h.srv.DebugAddr() != "" {
		t.Errorf("debug address %q without --debug-addr; want none", h.srv.DebugAddr())
	}

	h = start(t, b, func(c *Config) { c.DebugAddr = "127.0.0.1:0" })
	if code, body := get("http://"+h.srv.DebugAddr()+"/debug/pprof/", ""); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof index in development mode = %d", code)
	}

	h = start(t, b, withTokens(t), func(c *Config) { c.DebugAddr = "127.0.0.1:0" })
	url := "http://" + h.srv.DebugAddr() + "/debug/pprof/goroutine?debug=1"
	if code, _ := get(url, ""); code != http.StatusUnauthorized {
		t.Errorf("pprof without credentials = %d; want 401", code)
	}
	if code, _ := get(url, "Bearer "+tokenA); code != http.StatusForbidden {
		t.Errorf("pprof for a user = %d; want 403", code)
	}
	if code, body := get(url, "Bearer "+tokenAdmin); code != 200 || !strings.Contains(body, "goroutine profile") {
		t.Errorf("pprof for the admin = %d", code)
	}

	_, err := New(tctx(t), Config{Database: b.NewDSN(t), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "0.0.0.0:0",
		ServerID: "s", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Errorf("development mode with a debug address on 0.0.0.0: %v; want a refusal", err)
	}
}

// TestWebFiles: the web view's files are served from the binary with a
// policy that keeps the page to its own origin; unknown files and methods
// get the API's errors.
func TestWebFiles(t *testing.T) {
	h := start(t, repotest.Backends(t)[0], withTokens(t))
	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/", "text/html", `<script src="/ui/app.js"`},
		{"/ui/app.js", "text/javascript", "sessionStorage"},
		{"/ui/style.css", "text/css", ".state.RUNNING"},
	} {
		// No credentials: the files hold no data.
		resp, err := http.Get(h.base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.contentType) || !strings.Contains(string(body), tc.contains) {
			t.Errorf("GET %s = %d %s; want %s containing %q", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.contentType, tc.contains)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tc.path, csp)
		}
		// Revalidation (the files are served no-cache) answers 304 until
		// the server changes.
		modified := resp.Header.Get("Last-Modified")
		req, err := http.NewRequest(http.MethodGet, h.base+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("If-Modified-Since", modified)
		again, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = again.Body.Close()
		if modified == "" || again.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s again, If-Modified-Since its Last-Modified %q: %d; want 304", tc.path, modified, again.StatusCode)
		}
	}
	code, body := h.restCall(t, http.MethodGet, "/ui/missing.js", nil)
	if code != 404 || !strings.Contains(body["message"].(string), "missing.js") {
		t.Errorf("GET /ui/missing.js = %d %v; want 404 naming it", code, body)
	}
	code, _ = h.restCall(t, http.MethodPost, "/", nil)
	if code != http.StatusMethodNotAllowed {
		t.Errorf("POST / = %d; want 405", code)
	}
	// The data behind the page is the API's: without a token, nothing.
	code, body = h.restCall(t, http.MethodGet, "/v1/clusters", nil)
	if code != http.StatusUnauthorized {
		t.Errorf("GET /v1/clusters without a token = %d %v; want 401", code, body)
	}
}
