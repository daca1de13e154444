package e2e

import (
	"context"
	"encoding/xml"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra/libvirt"
)

// The real-VM tests run clusterd with --infra libvirt on qemu:///system:
// every machine is a QEMU (TCG) guest booted from the node image, its node
// agent answering over a virtio-serial channel. A guest boots in 3-17 s
// here depending on the load, and an operation walks its machines one step
// at a time, so their waits are long.
const (
	vmOpTimeout    = 15 * time.Minute
	vmStateTimeout = 5 * time.Minute
	vmPollEvery    = 50 * time.Millisecond
	systemURI      = "qemu:///system"
)

// vmEnv is one test's private corner of qemu:///system: its own database,
// storage pool (a folder under /var/tmp, short enough for the agents'
// socket paths) and pool name, so that what it leaves can be found and
// removed without touching anyone else's domains.
type vmEnv struct {
	dsn    string
	dir    string
	pool   string
	uri    string
	kernel string
	initrd string
}

// newVMEnv prepares a real-VM test on uri (qemu:///system, or libvirt's
// test driver for the benchmark's baseline). It skips the test when
// libvirtd does not answer or the node image is missing (make libvirt, make
// node-image), failing it instead under CI, as the driver's own tests do.
// Whatever the test leaves (domains whose files are in its folder, their
// volumes, its pool, the network filters of its clusters) is removed with
// virsh when it ends, after its clusterd processes are killed.
func newVMEnv(t *testing.T, uri string) *vmEnv {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") != "" {
		skip = t.Fatalf
	}
	u, _ := url.Parse(uri)
	l, err := golibvirt.ConnectToURI(u)
	if err != nil {
		skip("libvirtd does not answer on %s (make libvirt starts it): %v", uri, err)
	}
	_ = l.Disconnect()
	if _, err := exec.LookPath("virsh"); err != nil {
		skip("no virsh (make libvirt installs libvirt-clients): %v", err)
	}
	e := &vmEnv{uri: uri, pool: "clusterd-e2e-" + uuid.NewString()[:8]}
	if !strings.HasPrefix(uri, "test") {
		e.kernel, e.initrd = os.Getenv("CLUSTERD_TEST_NODE_KERNEL"), os.Getenv("CLUSTERD_TEST_NODE_INITRD")
		if e.kernel == "" && e.initrd == "" {
			e.kernel, e.initrd = "../build/node-image/vmlinuz", "../build/node-image/initrd.img"
		}
		for _, f := range []*string{&e.kernel, &e.initrd} {
			abs, err := filepath.Abs(*f)
			if _, serr := os.Stat(abs); err != nil || serr != nil {
				skip("no node image at %s (make node-image, or CLUSTERD_TEST_NODE_KERNEL and CLUSTERD_TEST_NODE_INITRD)", *f)
			}
			*f = abs
		}
	}
	e.dsn = newDatabase(t)
	// QEMU runs as another user: the folder must be reachable by it. Its
	// path stays short: the agents' unix sockets live in it.
	e.dir, err = os.MkdirTemp("/var/tmp", "cde2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Registered after the database (dropped after this) and before any
	// server (killed before this), so no clusterd makes anything more while
	// it runs and the clusters' ids can still be read.
	t.Cleanup(func() {
		if left := e.leftovers(t); len(left) > 0 && !t.Failed() {
			t.Errorf("left behind (now removed): %v", left)
		}
		e.removeAll(t)
	})
	return e
}

// flags are the clusterd flags of the environment's libvirt driver.
func (e *vmEnv) flags() []string {
	f := []string{"--infra", "libvirt", "--libvirt-uri", e.uri, "--libvirt-pool-dir", e.dir, "--libvirt-pool", e.pool}
	if e.kernel != "" {
		f = append(f, "--node-kernel", e.kernel, "--node-initrd", e.initrd)
	}
	return f
}

// virsh runs virsh on the environment's connection and returns its output.
func (e *vmEnv) virsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-c", e.uri}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (e *vmEnv) mustVirsh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.virsh(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// filterURI is where the driver keeps network filters: the test driver has
// none, so they live on qemu:///system.
func (e *vmEnv) filterURI() string {
	if strings.HasPrefix(e.uri, "test") {
		return systemURI
	}
	return e.uri
}

// domains are the names of the domains this environment's clusterd made:
// clusterd's domains whose agent socket is in its folder.
func (e *vmEnv) domains(t *testing.T) []string {
	t.Helper()
	out, err := e.virsh("list", "--all", "--name")
	if err != nil {
		t.Errorf("list domains: %v", err)
		return nil
	}
	var mine []string
	for _, name := range strings.Fields(out) {
		if !strings.HasPrefix(name, "clusterd-") {
			continue
		}
		x, err := e.virsh("dumpxml", name)
		if err == nil && strings.Contains(x, e.dir+"/") {
			mine = append(mine, name)
		}
	}
	return mine
}

// isoCache is the folder of the driver's cached ISOs in its pool folder,
// which the directory pool lists as a volume: it is kept for the next
// cluster, as a machine's volume is not.
const isoCache = "iso"

// volumes are the volumes in the environment's pool but the ISO cache
// (none once the pool is gone).
func (e *vmEnv) volumes(t *testing.T) []string {
	t.Helper()
	out, err := e.virsh("vol-list", "--pool", e.pool)
	if err != nil {
		return nil // no pool
	}
	var vols []string
	for _, line := range strings.Split(out, "\n")[2:] {
		if f := strings.Fields(line); len(f) > 0 && f[0] != isoCache {
			vols = append(vols, f[0])
		}
	}
	return vols
}

// filters are the network filters of the clusters in the environment's
// database.
func (e *vmEnv) filters(t *testing.T) []string {
	t.Helper()
	rows, err := openSQL(t, e.dsn).Query("SELECT id FROM clusters")
	if err != nil {
		t.Errorf("read the clusters' ids: %v", err)
		return nil
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err == nil {
			ids = append(ids, id)
		}
	}
	out, err := exec.Command("virsh", "-c", e.filterURI(), "nwfilter-list").CombinedOutput()
	if err != nil {
		t.Errorf("nwfilter-list: %v: %s", err, out)
		return nil
	}
	var mine []string
	for _, f := range strings.Fields(string(out)) {
		for _, id := range ids {
			if f == libvirt.FilterName(id) {
				mine = append(mine, f)
			}
		}
	}
	return mine
}

// leftovers lists every domain, volume and network filter of the
// environment's that exists.
func (e *vmEnv) leftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	for _, d := range e.domains(t) {
		left = append(left, "domain "+d)
	}
	for _, v := range e.volumes(t) {
		left = append(left, "volume "+v)
	}
	for _, f := range e.filters(t) {
		left = append(left, "nwfilter "+f)
	}
	return left
}

// removeAll removes with virsh whatever the environment's clusterd made,
// then its pool and folder.
func (e *vmEnv) removeAll(t *testing.T) {
	t.Helper()
	for _, d := range e.domains(t) {
		_, _ = e.virsh("destroy", d)
		if _, err := e.virsh("undefine", d, "--managed-save"); err != nil {
			t.Errorf("clean-up: %v", err)
		}
	}
	for _, f := range e.filters(t) {
		if out, err := exec.Command("virsh", "-c", e.filterURI(), "nwfilter-undefine", f).CombinedOutput(); err != nil {
			t.Errorf("clean-up: nwfilter-undefine %s: %v: %s", f, err, out)
		}
	}
	for _, v := range e.volumes(t) {
		if _, err := e.virsh("vol-delete", "--pool", e.pool, v); err != nil {
			t.Errorf("clean-up: %v", err)
		}
	}
	if _, err := e.virsh("pool-info", e.pool); err == nil {
		_, _ = e.virsh("pool-destroy", e.pool)
		if _, err := e.virsh("pool-undefine", e.pool); err != nil {
			t.Errorf("clean-up: %v", err)
		}
	}
	if err := os.RemoveAll(e.dir); err != nil {
		t.Errorf("clean-up: %v", err)
	}
}

// domState is virsh's state of a machine's domain ("running", "shut off").
func (e *vmEnv) domState(t *testing.T, machine string) string {
	t.Helper()
	return strings.TrimSpace(e.mustVirsh(t, "domstate", libvirt.DomainName(machineID(machine))))
}

// vmMeta is clusterd's metadata on a domain, as virsh reads it.
type vmMeta struct {
	Cluster string `xml:"cluster,attr"`
	Role    string `xml:"role,attr"`
	Version string `xml:"version,attr"`
	Joined  bool   `xml:"joined,attr"`
	Job     string `xml:"job,attr"`
	Attempt int32  `xml:"attempt,attr"`
}

// domMeta reads clusterd's metadata of a machine's domain with virsh
// (the persistent definition's).
func (e *vmEnv) domMeta(t *testing.T, machine string) vmMeta {
	t.Helper()
	out := e.mustVirsh(t, "metadata", libvirt.DomainName(machineID(machine)), libvirt.MetadataNamespace, "--config")
	var m vmMeta
	if err := xml.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("metadata of %s: %v: %s", machine, err, out)
	}
	return m
}

// machineID is the id in a node's name, machines/{id}.
func machineID(name string) string { return strings.TrimPrefix(name, "machines/") }

// clusterID is the id in a cluster's name, clusters/{id}.
func clusterID(name string) string { return strings.TrimPrefix(name, "clusters/") }

// stepSeen is a step of an operation as a poll first saw it.
type stepSeen struct {
	step string
	done int32 // steps done when seen
	at   time.Time
}

// waitVMOp polls an operation until it is done (within vmOpTimeout) and
// returns it with the steps seen on the way, in order; at, when not nil,
// is called with each new step and may stop the wait by returning true
// (the operation is then returned not done).
func (s *server) waitVMOp(t *testing.T, name string, at func(md *clv1.OperationMetadata) bool) (*longrunningpb.Operation, []stepSeen) {
	t.Helper()
	deadline := time.Now().Add(vmOpTimeout)
	var seen []stepSeen
	for {
		ctx, cancel := rpcCtx()
		op, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
		cancel()
		now := time.Now()
		if err != nil {
			t.Fatalf("GetOperation %s: %v", name, err)
		}
		md := metadata(t, op)
		if n := len(seen); md.GetStep() != "" && (n == 0 || seen[n-1].step != md.GetStep() || seen[n-1].done != md.GetStepsDone()) {
			seen = append(seen, stepSeen{md.GetStep(), md.GetStepsDone(), now})
			if at != nil && !op.GetDone() && at(md) {
				return op, seen
			}
		}
		if op.GetDone() {
			return op, seen
		}
		if now.After(deadline) {
			t.Fatalf("operation %s not done within %s: %v", name, vmOpTimeout, md)
		}
		time.Sleep(vmPollEvery)
	}
}

// vmSucceed waits for an operation that what started and requires it to
// succeed.
func (s *server) vmSucceed(t *testing.T, what string, op *longrunningpb.Operation, err error) (*longrunningpb.Operation, []stepSeen) {
	t.Helper()
	began := time.Now()
	done, seen := s.waitVMOp(t, started(t, what, op, err), nil)
	if e := done.GetError(); e != nil {
		t.Fatalf("%s (%s) failed: code %d: %s", what, done.GetName(), e.GetCode(), e.GetMessage())
	}
	end := time.Now()
	var steps []string
	for i, st := range seen {
		next := end
		if i+1 < len(seen) {
			next = seen[i+1].at
		}
		steps = append(steps, fmt.Sprintf("%s %s", st.step, next.Sub(st.at).Round(10*time.Millisecond)))
	}
	t.Logf("%s: %s (%s)", what, end.Sub(began).Round(100*time.Millisecond), strings.Join(steps, ", "))
	return done, seen
}

// nodesOf returns a cluster's nodes as GetCluster reports them.
func (s *server) nodesOf(t *testing.T, cluster string) []*clv1.Node {
	t.Helper()
	return s.cluster(t, cluster).GetNodes()
}

// wantNodes checks a cluster through the API and virsh: its state, and
// that it has control and worker nodes, each with the power, joined state
// and version given (version "" is not checked), their domains in the
// matching virsh state and metadata.
func (e *vmEnv) wantNodes(t *testing.T, s *server, cluster string, state clv1.Cluster_State, control, workers int, power clv1.Node_Power, version string) []*clv1.Node {
	t.Helper()
	c := s.cluster(t, cluster)
	if c.GetState() != state || c.GetCurrentOperation() != "" {
		t.Errorf("%s is %s held by %q; want %s", cluster, c.GetState(), c.GetCurrentOperation(), state)
	}
	count := map[clv1.Node_Role]int{}
	wantDom := map[clv1.Node_Power]string{clv1.Node_RUNNING: "running", clv1.Node_STOPPED: "shut off"}[power]
	for _, n := range c.GetNodes() {
		count[n.GetRole()]++
		if n.GetPower() != power || !n.GetJoined() || (version != "" && n.GetKubernetesVersion() != version) {
			t.Errorf("node %s of %s: power %s, joined %t, version %s; want %s, joined, %q", n.GetName(), cluster, n.GetPower(), n.GetJoined(), n.GetKubernetesVersion(), power, version)
		}
		if got := e.domState(t, n.GetName()); got != wantDom {
			t.Errorf("domain of %s: virsh domstate %q; want %q", n.GetName(), got, wantDom)
		}
		m := e.domMeta(t, n.GetName())
		if m.Cluster != clusterID(cluster) || !m.Joined || (version != "" && m.Version != version) {
			t.Errorf("virsh metadata of %s: %+v; want cluster %s, joined, version %q", n.GetName(), m, clusterID(cluster), version)
		}
	}
	if count[clv1.Node_CONTROL] != control || count[clv1.Node_WORKER] != workers || len(c.GetNodes()) != control+workers {
		t.Errorf("%s has %d control and %d worker nodes (%d in all); want %d and %d", cluster, count[clv1.Node_CONTROL], count[clv1.Node_WORKER], len(c.GetNodes()), control, workers)
	}
	return c.GetNodes()
}

// domainsOf are the names of the domains whose metadata names cluster.
func (e *vmEnv) domainsOf(t *testing.T, cluster string) []string {
	t.Helper()
	var out []string
	for _, d := range e.domains(t) {
		m := e.domMeta(t, strings.TrimPrefix(d, "clusterd-"))
		if m.Cluster == clusterID(cluster) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// loadAverage is the 1-minute load average, for the figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
