package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestJSONPath: the subset of kubectl's jsonpath that -o jsonpath takes.
func TestJSONPath(t *testing.T) {
	list := &clv1.ListClustersResponse{Clusters: []*clv1.Cluster{
		{Name: "clusters/a", DisplayName: "web", WorkerNodeCount: 2, Nodes: []*clv1.Node{{Name: "machines/1"}, {Name: "machines/2"}}},
		{Name: "clusters/b", DisplayName: "db"},
	}}
	for _, tt := range []struct{ tmpl, want string }{
		{"{.items[*].displayName}", "web db"},
		{"{.clusters[*].displayName}", "web db"},
		{"{.items[0].name}", "clusters/a"},
		{"{.items[-1].displayName}", "db"},
		{"{$.items[1].workerNodeCount}", "0"}, // unset fields are there, as zero
		{"{.items[0].nodes[*].name}", "machines/1 machines/2"},
		{"{.items[0]['displayName']}", "web"},
		{`{range .items[*]}{.displayName}{"\t"}{.workerNodeCount}{"\n"}{end}`, "web\t2\ndb\t0\n"},
		{`{range .items}[{.name}]{end}`, "[clusters/a][clusters/b]"},
		{"names: {.items[*].displayName}!", "names: web db!"},
		{"{.nosuch}{.items[5].name}", ""},
		{"{.items[0].nodes[0]}", `{"displayName":"","joined":false,"kubernetesVersion":"","name":"machines/1","power":"POWER_UNSPECIFIED","role":"ROLE_UNSPECIFIED"}`},
	} {
		var out bytes.Buffer
		a := &app{stdout: &out, output: "jsonpath=" + tt.tmpl}
		if err := a.show(view{msg: list, list: true}); err != nil || out.String() != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.tmpl, out.String(), err, tt.want)
		}
	}
	for _, bad := range []string{"{.items", "{end}", "{range .items}x", "{..name}", "{.items[?(@.x)]}", "{items}"} {
		if err := checkOutput("jsonpath=" + bad); err == nil {
			t.Errorf("jsonpath=%s was accepted", bad)
		}
	}
}

// TestShortDuration: ages as kubectl writes them.
func TestShortDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {42 * time.Second, "42s"}, {119 * time.Second, "119s"}, {5*time.Minute + 10*time.Second, "5m10s"},
		{7 * time.Minute, "7m"}, {95 * time.Minute, "95m"}, {5*time.Hour + 30*time.Minute, "5h30m"}, {30 * time.Hour, "30h"},
		{50 * time.Hour, "2d2h"}, {40 * 24 * time.Hour, "40d"},
	} {
		if got := shortDuration(tt.d); got != tt.want {
			t.Errorf("shortDuration(%v) = %q; want %q", tt.d, got, tt.want)
		}
	}
}

// TestOutputFormats: -o yaml, name, jsonpath and wide on get, list and
// operations; operations list is newest first, with the cluster's display
// name, age, duration and a failure's reason, and --failed.
func TestOutputFormats(t *testing.T) {
	addr := serve(t)
	env := map[string]string{"CLUSTERCTL_SERVER": addr}
	s := sim(t, addr)
	c := clusterJSON(t, ok(t, env, "create", "web", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait", "-o", "json").stdout)
	ok(t, env, "create", "db", "--kubernetes-version", "1.30.2", "--offering", "medium", "--wait")

	// yaml: the JSON's fields, as YAML.
	var doc map[string]any
	r := ok(t, env, "get", "web", "-o", "yaml")
	if err := yaml.Unmarshal([]byte(r.stdout), &doc); err != nil || doc["displayName"] != "web" || doc["state"] != "RUNNING" || !strings.HasPrefix(r.stdout, "name: clusters/") {
		t.Errorf("get -o yaml = %q (%v); want the cluster as YAML", r.stdout, err)
	}
	back, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if got := (&clv1.Cluster{}); protojson.Unmarshal(back, got) != nil || got.GetName() != c.GetName() {
		t.Errorf("get -o yaml does not read back as the cluster: %s", back)
	}
	if r := ok(t, env, "list", "-o", "yaml"); !strings.Contains(r.stdout, "clusters:\n  - name: clusters/") {
		t.Errorf("list -o yaml =\n%s", r.stdout)
	}

	// name
	if r := ok(t, env, "get", "web", "-o", "name"); r.stdout != c.GetName()+"\n" {
		t.Errorf("get -o name = %q; want %s", r.stdout, c.GetName())
	}
	if r := ok(t, env, "list", "-o", "name"); strings.Count(r.stdout, "clusters/") != 2 || strings.Count(r.stdout, "\n") != 2 {
		t.Errorf("list -o name = %q", r.stdout)
	}
	// jsonpath
	if r := ok(t, env, "list", "-o", "jsonpath={.items[*].displayName}"); r.stdout != "web db" {
		t.Errorf("list -o jsonpath = %q", r.stdout)
	}
	if r := ok(t, env, "get", "web", "-o", "jsonpath={.state} {.nodes[*].role}"); r.stdout != "RUNNING CONTROL WORKER" {
		t.Errorf("get -o jsonpath = %q", r.stdout)
	}
	// wide: more columns.
	if r := ok(t, env, "list", "-o", "wide"); !regexp.MustCompile(`(?m)^DISPLAY NAME.*AGE\s+OFFERING\s+AUTOSCALING\s+ENDPOINT\s+CREATED\s+WHY$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^web\s.*\s+medium\s+-\s+\S+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+\s+-$`).MatchString(r.stdout) {
		t.Errorf("list -o wide =\n%s", r.stdout)
	}
	if r := ok(t, env, "get", "web", "-o", "wide"); !regexp.MustCompile(`(?m)^NODE\s+MACHINE\s+ROLE\s+POWER\s+JOINED\s+KUBERNETES\s+OFFERING$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^web-worker-[0-9a-f]{8}\s+machines/\S+\s+WORKER\s+RUNNING\s+true\s`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^Created:\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \(\d+s ago\)$`).MatchString(r.stdout) {
		t.Errorf("get -o wide =\n%s", r.stdout)
	}

	// A failed scale of db, then a stop of web: newest first.
	if _, err := s.Simulator.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "provision_machine", Mode: clv1.Fault_FAIL, Count: 1}}); err != nil {
		t.Fatal(err)
	}
	failed := operationPattern.FindString(ctl(t, env, "scale", "db", "--workers", "2", "--wait").stderr)
	stop := operationPattern.FindString(ok(t, env, "stop", "web").stdout)
	ok(t, env, "operations", "wait", stop)
	r = ok(t, env, "operations", "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 || !regexp.MustCompile(`^OPERATION\s+VERB\s+CLUSTER\s+STATUS\s+STEP\s+PROGRESS\s+AGE\s+DURATION\s+ERROR$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^`+stop+`\s+stop\s+web\s+succeeded\s+\S+\s+\d+/\d+\s+\d+s\s+\d+s\s+-$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^`+failed+`\s+scale\s+db\s+failed\s+provision_machine\s+\d+/\d+\s+\d+s\s+\d+s\s+STEP_FAILED$`).MatchString(lines[2]) ||
		!strings.Contains(lines[4], " create ") || !strings.Contains(lines[4], " web ") {
		t.Errorf("operations list =\n%s\nwant newest first: the stop, the failed scale, the creates", r.stdout)
	}
	if r := ok(t, env, "operations", "list", "--failed", "-o", "name"); r.stdout != failed+"\n" {
		t.Errorf("operations list --failed -o name = %q; want %s", r.stdout, failed)
	}
	if r := ok(t, env, "operations", "list", "--limit", "1", "-o", "jsonpath={.items[*].name}"); r.stdout != stop {
		t.Errorf("operations list --limit 1 = %q; want the newest, %s", r.stdout, stop)
	}
	if r := ok(t, env, "operations", "list", "-o", "wide"); !regexp.MustCompile(`(?m)^` + stop + `\s.*\s` + c.GetName() + `\s+ctl-test\s+\d{4}-`).MatchString(r.stdout) {
		t.Errorf("operations list -o wide =\n%s", r.stdout)
	}
	var op longrunningpb.Operation
	if err := protojson.Unmarshal([]byte(ok(t, env, "operations", "get", failed, "-o", "json").stdout), &op); err != nil || op.GetName() != failed {
		t.Errorf("operations get -o json: %v, %v", &op, err)
	}
	if r := ok(t, env, "operations", "get", failed, "-o", "yaml"); !strings.Contains(r.stdout, "done: true") {
		t.Errorf("operations get -o yaml =\n%s", r.stdout)
	}
	refused(t, env, 2, "-o name:", "events", "web", "-o", "name")
	if r := ok(t, env, "events", "web", "-o", "jsonpath={.items[*].event}"); !strings.HasPrefix(r.stdout, "CLUSTER_CREATED ") {
		t.Errorf("events -o jsonpath = %q", r.stdout)
	}
}
