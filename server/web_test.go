package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/chromedp/chromedp"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
)

// browser starts headless Chromium (Debian's) with a fresh profile and
// returns a tab, closed at the end of the test. Without Chromium the test
// is skipped, or fails under CI (make test installs it: make chromium).
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed (make chromium installs it)")
		}
		t.Skip("chromium is not installed: the web view is not tested (make chromium installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium keeps its singleton socket in a folder of TMPDIR, not of
		// the profile: one of the test's own, removed with it.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(ctx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelTab)
	return ctx
}

// artifacts is where the test leaves screenshots for people to look at:
// $CLUSTERD_TEST_ARTIFACTS, or test-artifacts/ at the top of the repository
// (git-ignored).
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CLUSTERD_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "test-artifacts")
	}
	dir, err := filepath.Abs(filepath.Join(dir, "web"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("web view screenshot: %s", path)
}

// see waits (bounded) until the JavaScript expression is truthy on the
// page, and returns its value: what a person looking at the page would see.
func see[T any](t *testing.T, ctx context.Context, what, expr string) T {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := chromedp.Run(ctx, chromedp.Poll[T](expr,
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(time.Until(deadline))))
		if err == nil {
			return v
		}
		// A page still loading (a navigation, a reload) replaces its
		// JavaScript context under the poll: poll the new one.
		if !contextReplaced(err) || time.Now().After(deadline) {
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("the page never showed %s: %v\npage text:\n%s", what, err, text)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// contextReplaced tells the browser's errors for a JavaScript context that
// went away under a call (the page navigated or reloaded).
func contextReplaced(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Cannot find context with specified id") || strings.Contains(msg, "Execution context was destroyed")
}

// webSpan is one entry of the timeline as the page shows it.
type webSpan struct {
	Verb, Result, Operation, Holder, Marks, Text string
}

// TestWebView loads the web view in headless Chromium against a real
// server whose cluster has a history (created; a scale that failed and
// whose leftover machine was repaired; recovered by the scanner) and a
// running scale held at join_node, and checks what a person sees: the
// token prompt, the cluster's state and the running operation's progress
// in the list, then on the cluster's page its nodes and the timeline of who
// held it when, the recovery and the repair marked; then that the page
// follows the scale to its end on its own. Screenshots go to
// test-artifacts/web/.
func TestWebView(t *testing.T) {
	ctx := browser(t)
	dir := artifacts(t)
	h := start(t, repotest.Backends(t)[0], withTokens(t), busyScanner)

	c := h.create(t, "web", 1)
	if _, err := h.clients.sim.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{
		Step: "join_node", Mode: clv1.Fault_FAIL, Cluster: c.GetName(), Count: 1}}); err != nil {
		t.Fatal(err)
	}
	two := int32(2)
	op, err := h.clients.clusters.ScaleCluster(tctx(t), &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: &two})
	if err != nil {
		t.Fatal(err)
	}
	h.wait(t, op)
	h.waitState(t, c.GetName(), clv1.Cluster_RUNNING) // ALERT, recovered by the scanner
	if _, err := h.clients.sim.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "join_node", Mode: clv1.Fault_HOLD}}); err != nil {
		t.Fatal(err)
	}
	running, err := h.clients.clusters.ScaleCluster(tctx(t), &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: &two})
	if err != nil {
		t.Fatal(err)
	}
	ops, err := h.clients.ops.ListOperations(tctx(t), &longrunningpb.ListOperationsRequest{Filter: `cluster = "` + c.GetName() + `"`})
	if err != nil || len(ops.GetOperations()) != 4 {
		t.Fatalf("the cluster's operations = %v, %v; want create, scale, recover, scale", ops.GetOperations(), err)
	}
	createOp := ops.GetOperations()[0].GetName()

	var console struct {
		sync.Mutex
		bad []string
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			// A 401 answer is logged as a failed load; that is the point of
			// the first step. Exceptions and refused scripts or styles
			// (Content-Security-Policy) are bugs.
			if m.Type == chromedp.ConsoleException || strings.Contains(m.Text, "Content Security Policy") {
				console.Lock()
				console.bad = append(console.bad, string(m.Type)+": "+m.Text)
				console.Unlock()
			}
		}
	}()

	// Without a token the page says what it needs.
	if err := chromedp.Do(ctx, chromedp.Navigate(h.base+"/")); err != nil {
		t.Fatal(err)
	}
	prompt := see[string](t, ctx, "the token prompt",
		`(() => { const p = document.querySelector('#problem'); return p && !p.hidden && p.innerText; })()`)
	if !strings.Contains(prompt, "needs credentials") || !strings.Contains(prompt, "CREDENTIALS_MISSING") {
		t.Errorf("without a token the page says %q", prompt)
	}

	// With the admin's token: the cluster, its state, the scale's progress.
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), tokenAdmin), chromedp.Click(chromedp.CSS("#use-token"))); err != nil {
		t.Fatal(err)
	}
	row := see[map[string]any](t, ctx, "the cluster held at join_node",
		`(() => { const r = document.querySelector('#clusters tbody tr');
		   if (!r || !r.innerText.includes('join_node')) return false;
		   const bar = r.querySelector('[role=progressbar]');
		   return {text: r.innerText, done: +bar.getAttribute('aria-valuenow'), total: +bar.getAttribute('aria-valuemax'),
		           state: r.querySelector('.state').innerText, problem: !document.querySelector('#problem').hidden}; })()`)
	text, _ := row["text"].(string)
	for _, want := range []string{"web", c.GetName(), "ops", "SCALING", "1.30.2", "scale", "join_node", "scale to 2 workers: 2 worker machines now, 1 running and joined"} {
		if !strings.Contains(text, want) {
			t.Errorf("the cluster's row shows %q; want %q in it", text, want)
		}
	}
	if done, total := row["done"].(float64), row["total"].(float64); row["state"] != "SCALING" || done <= 0 || done >= total || row["problem"] == true {
		t.Errorf("row = %v; want SCALING with a partial bar and no problem shown", row)
	}
	// The account's quota: its one cluster, 1 control + 2 workers (the
	// scale's target, held while it runs), no limits.
	quota := see[string](t, ctx, "the account's quota",
		`(() => { const r = document.querySelector('#quotas tr[data-quota="accounts/ops/quota"]'); return r && r.innerText; })()`)
	for _, want := range []string{"ops", "1 / ∞", "3 / ∞", "default"} {
		if !strings.Contains(quota, want) {
			t.Errorf("the quota row shows %q; want %q in it", quota, want)
		}
	}
	if stored := see[string](t, ctx, "the token kept for the tab", `sessionStorage.getItem('clusterd.token')`); stored != tokenAdmin {
		t.Errorf("sessionStorage holds %q", stored)
	}
	screenshot(t, ctx, dir, "clusters.png")

	// The cluster's page: nodes, and the timeline from newest to oldest.
	// Clicked from within the page: the list is redrawn as the cluster
	// changes, so a node the browser protocol found may be gone by the time
	// it clicks ("Could not find node with given id").
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(document.querySelector('#clusters a.name').click(), true)`)); err != nil {
		t.Fatal(err)
	}
	spans := see[[]webSpan](t, ctx, "the timeline of four holders",
		`(() => { const li = [...document.querySelectorAll('#timeline > li')];
		   if (li.length < 4) return false;
		   return li.map(s => ({Verb: s.querySelector('.verb').innerText, Result: s.dataset.result, Operation: s.dataset.operation,
		     Holder: s.querySelector('.holder').innerText, Marks: [...s.querySelectorAll('.mark')].map(m => m.innerText).join(','),
		     Text: s.innerText})); })()`)
	want := []webSpan{
		{Verb: "scale", Result: "running", Operation: running.GetName()},
		{Verb: "recover", Result: "succeeded", Marks: "recovery"},
		{Verb: "scale", Result: "failed", Operation: op.GetName(), Marks: "1 repair"},
		{Verb: "create", Result: "succeeded", Operation: createOp},
	}
	if len(spans) != len(want) {
		t.Fatalf("the timeline shows %d spans: %+v; want %d", len(spans), spans, len(want))
	}
	for i, w := range want {
		s := spans[i]
		if s.Verb != w.Verb || s.Result != w.Result || (w.Operation != "" && s.Operation != w.Operation) || s.Marks != w.Marks {
			t.Errorf("timeline entry %d = %s %s %s marks %q; want %s %s %s marks %q", i, s.Verb, s.Result, s.Operation, s.Marks, w.Verb, w.Result, w.Operation, w.Marks)
		}
		if !strings.Contains(s.Holder, "held by operations/") || !strings.HasSuffix(s.Holder, "on server test-server") {
			t.Errorf("timeline entry %d says %q; want who held the cluster and on which server", i, s.Holder)
		}
	}
	for _, w := range []struct {
		span int
		text string
	}{
		{0, "join_node"}, {0, "scale up requested"}, {1, "recovery started"}, {2, "destroy_machine: machines/"},
		{2, "operation failed"}, {2, "repair"}, {3, "cluster created"}, {3, "STARTING → RUNNING"},
	} {
		if !strings.Contains(spans[w.span].Text, w.text) {
			t.Errorf("timeline entry %d shows %q; want %q in it", w.span, spans[w.span].Text, w.text)
		}
	}
	// Events in words; their names stay in data-event.
	labels := see[[]string](t, ctx, "the timeline's events", `[...document.querySelectorAll('#timeline .events b')].map(b => b.dataset.event + '=' + b.innerText)`)
	for _, l := range labels {
		name, text, _ := strings.Cut(l, "=")
		if !regexp.MustCompile(`^[A-Z]+(_[A-Z]+)*$`).MatchString(name) || strings.ContainsAny(text, "_") || text != strings.ToLower(text) {
			t.Errorf("timeline event %q is shown as %q; want its name in data-event and words in the text", name, text)
		}
	}
	nodes := see[[]string](t, ctx, "the nodes", `[...document.querySelectorAll('#nodes tbody tr')].map(r => r.querySelector('.node-name').innerText + ' ' + r.dataset.machine)`)
	if len(nodes) != 3 { // control, worker, and the scale's machine being joined
		t.Errorf("the nodes table has %d rows: %v; want 3", len(nodes), nodes)
	}
	for _, n := range nodes {
		display, machine, _ := strings.Cut(n, " ")
		id := strings.ReplaceAll(machine, "-", "")
		if !regexp.MustCompile(`^web-(control|worker)-[0-9a-f]{8}$`).MatchString(display) || !strings.HasSuffix(id, display[len(display)-8:]) {
			t.Errorf("node row %q; want a readable name (web-ROLE-<end of its machine id>) beside its machine", n)
		}
	}
	// Desired against actual while the scale runs: 2 workers wanted, 2
	// worker machines there (1 joined, 1 held at join_node).
	size := see[map[string]any](t, ctx, "the scale's desired and actual size",
		`(() => { const d = document.querySelector('.cards .desired'); return d && {desired: d.dataset.desired, actual: d.dataset.actual, ready: d.dataset.ready, text: d.innerText}; })()`)
	if size["desired"] != "2" || size["actual"] != "2" || size["ready"] != "1" || !strings.Contains(size["text"].(string), "scale to 2 workers") {
		t.Errorf("the size card shows %v; want 2 workers desired, 2 worker machines of which 1 running and joined", size)
	}
	screenshot(t, ctx, dir, "cluster.png")

	// Live: the page follows the watch stream (it polls only while the
	// stream is down); released, the scale ends and the page shows it
	// without a reload.
	see[bool](t, ctx, "the page following the watch stream", `document.body.dataset.live === 'true'`)
	if _, err := h.clients.sim.ClearFaults(tctx(t), &clv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	see[bool](t, ctx, "the scale succeeded and the cluster RUNNING",
		`document.querySelector('#cluster .state').innerText === 'RUNNING' &&
		 document.querySelector('#timeline > li').dataset.result === 'succeeded'`)
	if gone := see[bool](t, ctx, "no desired size once the scale ended", `!document.querySelector('.desired')`); !gone {
		t.Error("the page still shows a desired size after the scale ended")
	}
	screenshot(t, ctx, dir, "cluster-after.png")

	// A machine stops: the page says why the cluster is ALERT and what to
	// do, from the cluster's status.
	got := fxGet(t, h, c.GetName())
	stopped := got.GetNodes()[len(got.GetNodes())-1].GetName()
	if _, err := h.clients.sim.SetMachinePower(tctx(t), &clv1.SetMachinePowerRequest{Name: stopped, Power: clv1.Node_STOPPED}); err != nil {
		t.Fatal(err)
	}
	status := see[string](t, ctx, "why the cluster is ALERT",
		`(() => { const b = document.querySelector('#status');
		   return document.querySelector('#cluster .state').innerText === 'ALERT' && b && b.innerText; })()`)
	for _, want := range []string{"Why:", "machine " + strings.TrimPrefix(stopped, "machines/") + " is STOPPED", "Next step:", "back to RUNNING by itself"} {
		if !strings.Contains(status, want) {
			t.Errorf("the status box says %q; want %q in it", status, want)
		}
	}
	screenshot(t, ctx, dir, "cluster-alert.png")

	// Development mode (another server, another origin): no token needed.
	dev := start(t, repotest.Backends(t)[0])
	dev.create(t, "dev", 1)
	if err := chromedp.Do(ctx, chromedp.Navigate(dev.base+"/")); err != nil {
		t.Fatal(err)
	}
	see[bool](t, ctx, "the development server's cluster without a token",
		`!!document.querySelector('#clusters tbody tr') && document.querySelector('#clusters tbody tr').innerText.includes('RUNNING')`)

	console.Lock()
	defer console.Unlock()
	for _, m := range console.bad {
		t.Errorf("browser console: %s", m)
	}
}

// click clicks the element from within the page (the page redraws every
// second, so a node found by the browser protocol may be gone by the click).
func click(t *testing.T, ctx context.Context, selector string) {
	t.Helper()
	see[bool](t, ctx, "a "+selector+" to click", `!!document.querySelector('`+selector+`')`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(document.querySelector('`+selector+`').click(), true)`)); err != nil {
		t.Fatalf("click %s: %v", selector, err)
	}
}

// TestWebActionsAndOperations drives a cluster from its page in headless
// Chromium, as its owner would: every action asks first (and "Keep as is"
// does nothing), then stop, start, a scale to 2 workers held at join_node
// and its cancellation; then the operations page lists the failed
// operation first, with its whole error, and filters by verb and state.
// Screenshots go to test-artifacts/web/.
func TestWebActionsAndOperations(t *testing.T) {
	ctx := browser(t)
	dir := artifacts(t)
	h := start(t, repotest.Backends(t)[0], withTokens(t), busyScanner)
	c := h.create(t, "web", 1)
	ops := func() int {
		t.Helper()
		l, err := h.clients.ops.ListOperations(tctx(t), &longrunningpb.ListOperationsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.GetOperations())
	}
	// A failed scale, for the operations page.
	if _, err := h.clients.sim.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{
		Step: "provision_machine", Mode: clv1.Fault_FAIL, Cluster: c.GetName(), Count: 1}}); err != nil {
		t.Fatal(err)
	}
	three := int32(3)
	failing, err := h.clients.clusters.ScaleCluster(tctx(t), &clv1.ScaleClusterRequest{Name: c.GetName(), WorkerNodeCount: &three})
	if err != nil {
		t.Fatal(err)
	}
	if done := h.wait(t, failing); done.GetError() == nil {
		t.Fatalf("the scale with a failing provision_machine succeeded")
	}
	h.waitState(t, c.GetName(), clv1.Cluster_RUNNING) // ALERT, recovered by the scanner
	before := ops()

	if err := chromedp.Do(ctx, chromedp.Navigate(h.base+"/#/clusters/"+strings.TrimPrefix(c.GetName(), "clusters/"))); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), tokenAdmin), chromedp.Click(chromedp.CSS("#use-token"))); err != nil {
		t.Fatal(err)
	}
	see[bool](t, ctx, "the cluster's page, RUNNING", `document.querySelector('#cluster .state') && document.querySelector('#cluster .state').innerText === 'RUNNING'`)

	// Asked, then kept as is: nothing is requested.
	click(t, ctx, "#action-stop")
	if q := see[string](t, ctx, "the stop's confirmation", `(() => { const d = document.querySelector('#confirm'); return d && d.innerText; })()`); !strings.Contains(q, "Stop web") {
		t.Errorf("the confirmation says %q; want it to name the action and the cluster", q)
	}
	click(t, ctx, "#confirm-no")
	see[bool](t, ctx, "the confirmation closed", `!document.querySelector('#confirm')`)
	if n := ops(); n != before {
		t.Errorf("after 'Keep as is' there are %d operations; want %d (nothing requested)", n, before)
	}

	// Stop, then start, each confirmed.
	for _, step := range []struct {
		button string
		want   clv1.Cluster_State
	}{{"#action-stop", clv1.Cluster_STOPPED}, {"#action-start", clv1.Cluster_RUNNING}} {
		click(t, ctx, step.button)
		click(t, ctx, "#confirm-yes")
		if n := see[string](t, ctx, "the notice of "+step.button, `(() => { const n = document.querySelector('#notice'); return n && n.innerText; })()`); !strings.Contains(n, "requested: operations/") {
			t.Errorf("after %s the page says %q; want the operation requested", step.button, n)
		}
		h.waitState(t, c.GetName(), step.want)
	}

	// Scale to 2, held at join_node; then cancel it from the page.
	if _, err := h.clients.sim.InjectFault(tctx(t), &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "join_node", Mode: clv1.Fault_HOLD, Cluster: c.GetName()}}); err != nil {
		t.Fatal(err)
	}
	see[bool](t, ctx, "the page RUNNING again", `document.querySelector('#cluster .state').innerText === 'RUNNING' && !!document.querySelector('#action-scale')`)
	click(t, ctx, "#action-scale")
	if n := see[string](t, ctx, "the scale's confirmation with the workers now", `(() => { const i = document.querySelector('#scale-workers'); return i && i.value; })()`); n != "1" {
		t.Errorf("the scale's confirmation starts at %s workers; want the cluster's 1", n)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(document.querySelector('#scale-workers').value = '2', true)`)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, dir, "cluster-confirm.png")
	click(t, ctx, "#confirm-yes")
	see[bool](t, ctx, "the scale running, with a cancel button",
		`document.querySelector('#cluster .state').innerText === 'SCALING' && !!document.querySelector('#action-cancel')`)
	if got := fxGet(t, h, c.GetName()); got.GetWorkerNodeCount() != 1 || got.GetCurrentOperation() == "" {
		t.Errorf("while the scale runs: %d workers recorded, operation %q; want 1 and the scale", got.GetWorkerNodeCount(), got.GetCurrentOperation())
	}
	scaleOp := fxGet(t, h, c.GetName()).GetCurrentOperation()
	click(t, ctx, "#action-cancel")
	click(t, ctx, "#confirm-yes")
	see[bool](t, ctx, "the cancellation requested", `(() => { const n = document.querySelector('#notice'); return !!n && n.innerText.includes('cancellation requested'); })()`)
	if _, err := h.clients.sim.ClearFaults(tctx(t), &clv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	done := h.wait(t, &longrunningpb.Operation{Name: scaleOp})
	if done.GetError().GetCode() != 1 {
		t.Errorf("the scale cancelled from the page ended %v; want CANCELLED", done.GetError())
	}

	// The operations page: the failed scale first, with its whole error.
	if err := chromedp.Do(ctx, chromedp.Navigate(h.base+"/#/operations")); err != nil {
		t.Fatal(err)
	}
	first := see[map[string]any](t, ctx, "the operations, failed first",
		`(() => { const r = document.querySelector('#operations tbody tr'); return r && {op: r.dataset.operation, result: r.dataset.result, text: r.innerText}; })()`)
	if first["op"] != failing.GetName() || first["result"] != "failed" {
		t.Errorf("the first operation listed is %v; want the failed scale %s", first, failing.GetName())
	}
	if text, _ := first["text"].(string); !strings.Contains(text, "provision_machine") || !strings.Contains(text, "web") {
		t.Errorf("the failed scale's row says %q; want its error (provision_machine) and the cluster's name", text)
	}
	screenshot(t, ctx, dir, "operations.png")
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`(() => { document.querySelector('#operations').dataset.stale = '1';
		   const s = document.querySelector('#filter-verb'); s.value = 'scale'; s.dispatchEvent(new Event('change')); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	verbs := see[[]string](t, ctx, "the page redrawn for the verb scale", `(() => { const table = document.querySelector('#operations');
		 if (!table || table.dataset.stale || !location.hash.includes('verb=scale')) return false;
		 const rows = [...table.querySelectorAll('tbody tr')];
		 return rows.map(r => r.querySelector('.verb').innerText + ' ' + r.dataset.result); })()`)
	if !slices.Equal(verbs, []string{"scale failed", "scale cancelled"}) {
		t.Errorf("filtered by verb scale: %v; want the failed scale, then the cancelled one", verbs)
	}
	for _, v := range verbs {
		if !strings.HasPrefix(v, "scale ") {
			t.Errorf("filtered by verb scale, the page lists %q", v)
		}
	}
}
