package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// TestHardening_RESTEdges: what REST would otherwise get wrong is refused
// with a google.rpc.Status carrying ErrorInfo (the reason) and, for
// INVALID_ARGUMENT, a BadRequest naming the part, and changes nothing: a
// non-ASCII credential header (which the gateway dropped, so that an admin
// saw every account), a JSON body declared as a form or as text (415), an
// encoded colon before a custom method (404: it names no route), and
// headers over the limit (431, as JSON rather than net/http's plain text).
func TestHardening_RESTEdges(t *testing.T) {
	h := start(t, repotest.Backends(t)[0], withTokens(t))
	fx := h.newFixture(t, 1)
	stop := "/v1/" + fx.cluster + ":stop"
	admin := "Bearer " + tokenAdmin
	for _, tc := range []struct {
		name, method, path string
		body               string
		headers            []string
		status             int
		reason             string
		field              string
	}{
		{"admin naming a non-ASCII account", "GET", "/v1/clusters", "", []string{"Authorization", admin, "X-Clusterd-Account", "tëam-b"}, 400, service.ReasonInvalidArgument, "x-clusterd-account"},
		{"admin creating in a non-ASCII account", "POST", "/v1/clusters", `{"displayName":"web","kubernetesVersion":"1.30.2","workerNodeCount":1,"serviceOffering":"medium"}`,
			[]string{"Authorization", admin, "X-Clusterd-Account", "tëam-b"}, 400, service.ReasonInvalidArgument, "x-clusterd-account"},
		{"user sending a non-ASCII account", "GET", "/v1/clusters", "", []string{"X-Clusterd-Account", "tëam-b"}, 400, service.ReasonInvalidArgument, "x-clusterd-account"},
		{"non-ASCII token", "GET", "/v1/clusters", "", []string{"Authorization", "Bearer tökën"}, 400, service.ReasonInvalidArgument, "authorization"},
		{"JSON sent as a form", "POST", stop, `{}`, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, service.ReasonUnsupportedMediaType, ""},
		{"JSON sent as text", "POST", stop, `{}`, []string{"Content-Type", "text/plain; charset=utf-8"}, 415, service.ReasonUnsupportedMediaType, ""},
		{"unparsable content type", "POST", stop, `{}`, []string{"Content-Type", "application/json; ===="}, 415, service.ReasonUnsupportedMediaType, ""},
		{"encoded colon before the method", "POST", "/v1/" + fx.cluster + "%3Astop", `{}`, nil, 404, service.ReasonNotFound, ""},
		{"encoded colon, lower case", "POST", "/v1/" + fx.cluster + "%3astop", `{}`, nil, 404, service.ReasonNotFound, ""},
		{"encoded colon on a read", "GET", "/v1/" + fx.cluster + "%3Astop", "", nil, 404, service.ReasonNotFound, ""},
		{"encoded colon on an operation", "POST", "/v1/" + fx.op + "%3Acancel", `{}`, nil, 404, service.ReasonNotFound, ""},
		{"headers over the limit", "GET", "/v1/clusters", "", []string{"X-Padding", strings.Repeat("p", maxRESTHeader)}, 431, service.ReasonRequestTooLarge, ""},
		{"many headers over the limit", "GET", "/v1/clusters", "", manyHeaders(maxRESTHeader/1000+1, 1000), 431, service.ReasonRequestTooLarge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := vSnapshot(t, h)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			code, out, _ := restCall(t, h, tc.method, tc.path, body, tc.headers...)
			info := vDetail(out, "google.rpc.ErrorInfo")
			if code != tc.status || info == nil || info["reason"] != tc.reason || info["domain"] != service.Domain {
				t.Errorf("%s %s: %d %v; want %d with ErrorInfo %s", tc.method, tc.path, code, out, tc.status, tc.reason)
			}
			if tc.field != "" {
				br := vDetail(out, "google.rpc.BadRequest")
				violations, _ := br["fieldViolations"].([]any)
				if v, _ := firstOf(violations).(map[string]any); len(violations) != 1 || v["field"] != tc.field {
					t.Errorf("BadRequest %v; want one violation, of %s", br, tc.field)
				}
			}
			if d := vDiff(before, vSnapshot(t, h)); d != "" {
				t.Errorf("changed the world:\n%s", d)
			}
		})
	}
	// What is refused above works when written right.
	code, out, _ := restCall(t, h, "GET", "/v1/clusters", nil, "Authorization", admin, "X-Clusterd-Account", "team-b",
		"X-Padding", strings.Repeat("p", maxRESTHeader/2))
	if code != http.StatusOK {
		t.Errorf("admin acting for team-b with headers within the limit: %d %v", code, out)
	}
	code, out, _ = restCall(t, h, "POST", stop, strings.NewReader(`{}`), "Content-Type", "application/json; charset=utf-8")
	if code != http.StatusOK {
		t.Fatalf("stop as application/json: %d %v", code, out)
	}
	h.wait(t, &longrunningpb.Operation{Name: out["name"].(string)})
}

// TestHardening_RESTAccountHeaderInDevelopmentMode: in development mode a
// non-ASCII x-clusterd-account is refused, not dropped (which created the
// cluster in `default`).
func TestHardening_RESTAccountHeaderInDevelopmentMode(t *testing.T) {
	h := start(t, repotest.Backends(t)[0])
	before := vSnapshot(t, h)
	code, out, _ := restCall(t, h, "POST", "/v1/clusters",
		strings.NewReader(`{"displayName":"web","kubernetesVersion":"1.30.2","workerNodeCount":1,"serviceOffering":"medium"}`),
		"X-Clusterd-Account", "tëam-a")
	if info := vDetail(out, "google.rpc.ErrorInfo"); code != http.StatusBadRequest || info == nil || info["reason"] != service.ReasonInvalidArgument {
		t.Errorf("create with a non-ASCII account: %d %v; want 400 INVALID_ARGUMENT", code, out)
	}
	if d := vDiff(before, vSnapshot(t, h)); d != "" {
		t.Errorf("changed the world:\n%s", d)
	}
}

// manyHeaders is n headers of size bytes each, as restCall takes them.
func manyHeaders(n, size int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("X-Padding-%d", i), strings.Repeat("p", size))
	}
	return out
}

func firstOf(xs []any) any {
	if len(xs) == 0 {
		return nil
	}
	return xs[0]
}
