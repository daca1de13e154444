package agent_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/agent"
)

// fakeISO is the "attached ISO" of an in-memory machine.
type fakeISO struct {
	mu      sync.Mutex
	version string // "" means no ISO attached
}

func (f *fakeISO) set(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version = v
}

func (f *fakeISO) Version() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.version == "" {
		return "", agent.ErrNoVersion
	}
	return f.version, nil
}

// machine is one agent served over net.Pipe, with its store and ISO.
type machine struct {
	store  agent.Store
	iso    *fakeISO
	client *agent.Client
	conn   net.Conn // the client's end
}

// startAgent serves an agent for machine "m-1" on store over a new pipe and
// returns a client for it; the agent is stopped and joined on cleanup.
func startAgent(t *testing.T, store agent.Store, iso *fakeISO) *machine {
	t.Helper()
	hostEnd, guestEnd := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Serve(ctx, guestEnd, agent.Config{State: store, ISO: iso, Machine: "m-1"})
	}()
	t.Cleanup(func() {
		cancel()
		hostEnd.Close()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("agent did not stop")
		}
	})
	return &machine{store: store, iso: iso, client: agent.NewClient(hostEnd), conn: hostEnd}
}

func newMachine(t *testing.T) *machine {
	return startAgent(t, &agent.MemStore{}, &fakeISO{})
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantRefusal checks err is the agent's refusal, mentioning want.
func wantRefusal(t *testing.T, err error, want string) {
	t.Helper()
	var ae *agent.Error
	if !errors.As(err, &ae) {
		t.Fatalf("got error %v, want an *agent.Error", err)
	}
	if !strings.Contains(ae.Message, want) {
		t.Fatalf("got refusal %q, want it to mention %q", ae.Message, want)
	}
}

func TestStatusOfANewMachine(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	got, err := m.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (agent.Status{Machine: "m-1"}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	m.iso.set("1.31.2")
	got, err = m.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.ISOVersion != "1.31.2" {
		t.Fatalf("got iso_version %q, want 1.31.2", got.ISOVersion)
	}
	if data, _ := m.store.Load(); data != nil {
		t.Fatalf("status saved state %q", data)
	}
}

func TestJoinInstallsTheISOsVersion(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)

	_, err := m.client.Join(ctx, "c-1", "1.31.2")
	wantRefusal(t, err, "read the attached ISO")
	m.iso.set("1.30.0")
	_, err = m.client.Join(ctx, "c-1", "1.31.2")
	wantRefusal(t, err, `holds version "1.30.0"`)
	if got, _ := m.client.Status(ctx); got.Joined || got.Version != "" {
		t.Fatalf("a refused join changed the node: %+v", got)
	}

	m.iso.set("1.31.2")
	got, err := m.client.Join(ctx, "c-1", "1.31.2")
	if err != nil {
		t.Fatal(err)
	}
	want := agent.Status{Machine: "m-1", Cluster: "c-1", Version: "1.31.2", ISOVersion: "1.31.2", Joined: true}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}

	// Again, and again with the ISO gone: the version is installed already.
	for _, iso := range []string{"1.31.2", ""} {
		m.iso.set(iso)
		got, err := m.client.Join(ctx, "c-1", "1.31.2")
		if err != nil {
			t.Fatalf("join again (iso %q): %v", iso, err)
		}
		want.ISOVersion = iso
		if got != want {
			t.Fatalf("join again (iso %q): got %+v, want %+v", iso, got, want)
		}
	}

	_, err = m.client.Join(ctx, "c-2", "1.31.2")
	wantRefusal(t, err, `joined to cluster "c-1"`)
	_, err = m.client.Join(ctx, "c-1", "1.32.0")
	wantRefusal(t, err, "upgrade instead")
	_, err = m.client.Join(ctx, "", "1.31.2")
	wantRefusal(t, err, "needs cluster and version")
}

func TestUpgradeInstallsFromTheISOAndUncordons(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	m.iso.set("1.31.2")

	_, err := m.client.Upgrade(ctx, "1.31.2")
	wantRefusal(t, err, "not joined")

	if _, err := m.client.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatal(err)
	}
	if got, err := m.client.Drain(ctx); err != nil || !got.Cordoned {
		t.Fatalf("drain: got %+v, %v; want cordoned", got, err)
	}
	_, err = m.client.Upgrade(ctx, "1.32.0")
	wantRefusal(t, err, `holds version "1.31.2"`)
	if got, _ := m.client.Status(ctx); got.Version != "1.31.2" || !got.Cordoned {
		t.Fatalf("a refused upgrade changed the node: %+v", got)
	}

	m.iso.set("1.32.0")
	got, err := m.client.Upgrade(ctx, "1.32.0")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "1.32.0" || got.Cordoned || !got.Joined || got.Cluster != "c-1" {
		t.Fatalf("got %+v, want joined to c-1 at 1.32.0, uncordoned", got)
	}
	// Repeated after the ISO is detached: installed already, still fine.
	m.iso.set("")
	if got, err := m.client.Upgrade(ctx, "1.32.0"); err != nil || got.Version != "1.32.0" {
		t.Fatalf("upgrade again: got %+v, %v", got, err)
	}
	_, err = m.client.Upgrade(ctx, "")
	wantRefusal(t, err, "needs version")
}

func TestDrainAndUncordon(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	_, err := m.client.Drain(ctx)
	wantRefusal(t, err, "not joined")
	_, err = m.client.Uncordon(ctx)
	wantRefusal(t, err, "not joined")

	m.iso.set("1.31.2")
	if _, err := m.client.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got, err := m.client.Drain(ctx); err != nil || !got.Cordoned {
			t.Fatalf("drain: got %+v, %v; want cordoned", got, err)
		}
	}
	for range 2 {
		if got, err := m.client.Uncordon(ctx); err != nil || got.Cordoned {
			t.Fatalf("uncordon: got %+v, %v; want not cordoned", got, err)
		}
	}
}

func TestLeaveForgetsTheCluster(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	m.iso.set("1.31.2")
	if _, err := m.client.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, err := m.client.Leave(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := agent.Status{Machine: "m-1", Version: "1.31.2", ISOVersion: "1.31.2"}
		if got != want {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	}
	_, err := m.client.Kubeconfig(ctx)
	wantRefusal(t, err, "not joined")
	// Another cluster may have the machine now.
	if got, err := m.client.Join(ctx, "c-2", "1.31.2"); err != nil || got.Cluster != "c-2" {
		t.Fatalf("join c-2: got %+v, %v", got, err)
	}
}

func TestKubeconfig(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	_, err := m.client.Kubeconfig(ctx)
	wantRefusal(t, err, "not joined")
	m.iso.set("1.31.2")
	if _, err := m.client.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatal(err)
	}
	got, err := m.client.Kubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: Config", `server: "https://m-1:6443"`, `current-context: "c-1"`} {
		if !strings.Contains(got, want) {
			t.Errorf("kubeconfig %q lacks %q", got, want)
		}
	}
}

func TestDeployRecordsTheAddon(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	_, err := m.client.Deploy(ctx, agent.AddonProvider)
	wantRefusal(t, err, "not joined")
	m.iso.set("1.31.2")
	if _, err := m.client.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatal(err)
	}
	_, err = m.client.Deploy(ctx, "dashboard")
	wantRefusal(t, err, `unknown add-on "dashboard"`)
	for _, name := range []string{agent.AddonProvider, agent.AddonAutoscaler, agent.AddonProvider} {
		if _, err := m.client.Deploy(ctx, name); err != nil {
			t.Fatalf("deploy %s: %v", name, err)
		}
	}
	var saved struct{ Addons []string }
	data, _ := m.store.Load()
	if err := json.Unmarshal(data, &saved); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(saved.Addons, ","); got != "autoscaler,provider" {
		t.Fatalf("got add-ons %q saved, want autoscaler,provider", got)
	}
}

func TestStateOutlivesTheConnection(t *testing.T) {
	store, iso := &agent.MemStore{}, &fakeISO{version: "1.31.2"}
	ctx := ctxFor(t)
	first := startAgent(t, store, iso)
	if _, err := first.client.Join(ctx, "c-1", "1.31.2"); err != nil {
		t.Fatal(err)
	}
	if _, err := first.client.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	first.conn.Close()

	iso.set("")
	second := startAgent(t, store, iso)
	got, err := second.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := agent.Status{Machine: "m-1", Cluster: "c-1", Version: "1.31.2", Joined: true, Cordoned: true}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// failingStore refuses to save, like a disk gone read-only.
type failingStore struct{ agent.MemStore }

func (*failingStore) Save([]byte) error { return errors.New("disk is read-only") }

func TestAFailedSaveIsAnError(t *testing.T) {
	m := startAgent(t, &failingStore{}, &fakeISO{version: "1.31.2"})
	got, err := m.client.Join(ctxFor(t), "c-1", "1.31.2")
	wantRefusal(t, err, "disk is read-only")
	if got.Joined {
		t.Fatalf("got %+v after a failed save, want not joined", got)
	}
}

func TestBadLinesAndUnknownOps(t *testing.T) {
	m := newMachine(t)
	ctx := ctxFor(t)
	_, err := m.client.Do(ctx, agent.Request{Op: "reboot"})
	wantRefusal(t, err, `unknown op "reboot"`)

	// Raw lines: garbage gets an id-0 error, an over-long line too, and the
	// connection still answers after them.
	r := bufio.NewReader(m.conn)
	// A well-formed request, but longer than any request has reason to be.
	long := `{"id":5,"op":"deploy","cluster":"","version":"","name":"` + strings.Repeat("x", 100<<10) + `"}`
	for _, line := range []string{"not json", long} {
		if _, err := m.conn.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		out, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var resp agent.Response
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.ID != 0 || resp.OK || !strings.Contains(resp.Error, "bad request") {
			t.Fatalf("got %+v for a bad line, want id 0, ok false, a bad request error", resp)
		}
	}
	if _, err := m.conn.Write([]byte(`{"id":7,"op":"status","cluster":"","version":"","name":""}` + "\n")); err != nil {
		t.Fatal(err)
	}
	out, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":7,"ok":true,"error":"","status":{"machine":"m-1","cluster":"","version":"","iso_version":"","joined":false,"cordoned":false},"kubeconfig":""}` + "\n"
	if string(out) != want {
		t.Fatalf("got %s, want %s", out, want)
	}
}

func TestServeEndsWithTheStreamOrTheContext(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	done := make(chan error, 1)
	cfg := agent.Config{State: &agent.MemStore{}, ISO: &fakeISO{}, Machine: "m-1"}
	go func() { done <- agent.Serve(context.Background(), guestEnd, cfg) }()
	hostEnd.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("got %v when the host went away, want nil", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return at EOF")
	}

	hostEnd, guestEnd = net.Pipe()
	defer hostEnd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- agent.Serve(ctx, guestEnd, cfg) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v when cancelled, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return when cancelled")
	}
}

// A call abandoned by its context does not desynchronise the client: the
// next call gets its own answer, not the stale one.
func TestAnAbandonedCallLeavesTheClientUsable(t *testing.T) {
	hostEnd, guestEnd := unixPair(t)
	c := agent.NewClient(hostEnd)

	// A slow agent: reads the first request, and answers it only after the
	// client gave up on it.
	gaveUp := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		r := bufio.NewReader(guestEnd)
		line, err := r.ReadBytes('\n')
		if err != nil {
			done <- err
			return
		}
		<-gaveUp
		var req agent.Request
		json.Unmarshal(line, &req)
		stale, _ := json.Marshal(agent.Response{ID: req.ID, OK: true, Kubeconfig: "stale"})
		if _, err := guestEnd.Write(append(stale, '\n')); err != nil {
			done <- err
			return
		}
		done <- agent.Serve(context.Background(), bufferedConn{r, guestEnd}, agent.Config{State: &agent.MemStore{}, ISO: &fakeISO{version: "1.31.2"}, Machine: "m-1"})
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := c.Kubeconfig(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline exceeded", err)
	}
	close(gaveUp)
	got, err := c.Join(ctxFor(t), "c-1", "1.31.2")
	if err != nil || !got.Joined {
		t.Fatalf("join after an abandoned call: got %+v, %v", got, err)
	}
	hostEnd.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// bufferedConn reads through a bufio.Reader that already holds some of
// the connection's input.
type bufferedConn struct {
	r *bufio.Reader
	net.Conn
}

func (b bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// unixPair returns the two ends of a unix socket connection, which (unlike
// net.Pipe) buffers what one end writes until the other reads, as the
// virtio-serial channel does.
func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	a, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
