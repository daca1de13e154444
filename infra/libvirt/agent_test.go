package libvirt_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clusterd/clusterd/agent"
	"github.com/clusterd/clusterd/infra/libvirt"
	"github.com/clusterd/clusterd/internal/syncbuf"
)

// TestSocketAgentsSpeakTheProtocol: a request is one JSON line on the
// machine's channel socket; the answer with the request's id is returned
// (an earlier request's answer is skipped), and a refusal is ErrAgent with
// the agent's message.
func TestSocketAgentsSpeakTheProtocol(t *testing.T) {
	dir := t.TempDir()
	const machine = "m1"
	var mu sync.Mutex
	var seen []agent.Request
	fakeGuest(t, dir, machine, func(conn net.Conn) {
		sc := bufio.NewScanner(conn)
		if sc.Scan() {
			var req agent.Request
			_ = json.Unmarshal(sc.Bytes(), &req)
			mu.Lock()
			seen = append(seen, req)
			mu.Unlock()
			enc := json.NewEncoder(conn)
			_ = enc.Encode(agent.Response{ID: req.ID - 1, OK: true, Status: agent.Status{Version: "stale"}})
			resp := agent.Response{ID: req.ID, OK: req.Op != agent.OpJoin, Status: agent.Status{Machine: machine, Version: "1.30.2", Joined: true}}
			if !resp.OK {
				resp.Error = "the attached ISO holds 1.29.9, not 1.30.2"
			}
			_ = enc.Encode(resp)
		}
	})
	a := libvirt.NewSocketAgents(dir)
	t.Cleanup(func() { _ = a.Close() })
	resp, err := a.Do(context.Background(), machine, agent.Request{Op: agent.OpStatus, Cluster: "c1"})
	if err != nil || resp.Status.Version != "1.30.2" || !resp.Status.Joined || resp.Status.Machine != machine {
		t.Fatalf("status: %+v, %v", resp, err)
	}
	_, err = a.Do(context.Background(), machine, agent.Request{Op: agent.OpJoin, Cluster: "c1", Version: "1.30.2"})
	if !errors.Is(err, libvirt.ErrAgent) || !contains(err.Error(), "holds 1.29.9") {
		t.Fatalf("refused join: %v; want ErrAgent with the agent's message", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0].Op != "status" || seen[0].Cluster != "c1" || seen[1].Version != "1.30.2" {
		t.Fatalf("the agent got %+v", seen)
	}
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := a.Do(short, "nobody", agent.Request{Op: agent.OpStatus}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a machine without a socket (%s): %v; want the context's end", filepath.Join(dir, "clusterd-nobody.agent"), err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestMemoryAgentsKeepTheAgentsRules: the in-process agents refuse what the
// real agent refuses, and a refused request changes nothing.
func TestMemoryAgentsKeepTheAgentsRules(t *testing.T) {
	iso := ""
	a := libvirt.NewMemoryAgents(func(context.Context, string) (string, error) { return iso, nil })
	ctx := context.Background()
	do := func(req agent.Request) (agent.Status, error) {
		resp, err := a.Do(ctx, "m1", req)
		return resp.Status, err
	}
	steps := []struct {
		name    string
		iso     string
		req     agent.Request
		refused string // "" when the request must succeed
		want    agent.Status
	}{
		{"drain before joining", "", agent.Request{Op: agent.OpDrain}, "not joined", agent.Status{}},
		{"join without an ISO", "", agent.Request{Op: agent.OpJoin, Cluster: "a", Version: "1.30.2"}, "no ISO attached", agent.Status{}},
		{"join", "1.30.2", agent.Request{Op: agent.OpJoin, Cluster: "a", Version: "1.30.2"}, "", agent.Status{Cluster: "a", Version: "1.30.2", Joined: true}},
		{"join another cluster", "1.30.2", agent.Request{Op: agent.OpJoin, Cluster: "b", Version: "1.30.2"}, "leave it first", agent.Status{Cluster: "a", Version: "1.30.2", Joined: true}},
		{"drain", "1.30.2", agent.Request{Op: agent.OpDrain}, "", agent.Status{Cluster: "a", Version: "1.30.2", Joined: true, Cordoned: true}},
		{"upgrade with the old ISO", "1.30.2", agent.Request{Op: agent.OpUpgrade, Version: "1.31.1"}, "holds version \"1.30.2\"", agent.Status{Cluster: "a", Version: "1.30.2", Joined: true, Cordoned: true}},
		{"upgrade", "1.31.1", agent.Request{Op: agent.OpUpgrade, Version: "1.31.1"}, "", agent.Status{Cluster: "a", Version: "1.31.1", Joined: true}},
		{"leave", "", agent.Request{Op: agent.OpLeave}, "", agent.Status{Version: "1.31.1"}},
		{"join at the installed version, no ISO", "", agent.Request{Op: agent.OpJoin, Cluster: "b", Version: "1.31.1"}, "", agent.Status{Cluster: "b", Version: "1.31.1", Joined: true}},
	}
	for _, s := range steps {
		iso = s.iso
		got, err := do(s.req)
		switch {
		case s.refused == "" && err != nil:
			t.Fatalf("%s: %v", s.name, err)
		case s.refused != "" && (!errors.Is(err, libvirt.ErrAgent) || !strings.Contains(err.Error(), s.refused)):
			t.Fatalf("%s: %v; want refused with %q", s.name, err, s.refused)
		}
		s.want.Machine, s.want.ISOVersion = "m1", s.iso
		if got != s.want {
			t.Fatalf("%s: status %+v; want %+v", s.name, got, s.want)
		}
	}
}

// TestSocketAgentsSendAgainWhatGotNoAnswer: a request the guest lost (read
// and dropped, as a port closing under it does) is sent again after Retry,
// on the same connection, and its answer is returned.
func TestSocketAgentsSendAgainWhatGotNoAnswer(t *testing.T) {
	dir := t.TempDir()
	conns := fakeGuest(t, dir, "m1", func(conn net.Conn) {
		answer(conn, func(n int) bool { return n == 0 }) // lost
	})
	a := libvirt.NewSocketAgents(dir)
	a.Retry = 50 * time.Millisecond
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := a.Do(ctx, "m1", agent.Request{Op: agent.OpStatus})
	if err != nil || resp.Status.Machine != "m1" {
		t.Fatalf("status after a lost sending: %+v, %v", resp, err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("the request was sent again on %d connections; want the same one", n)
	}
}

// TestSocketAgentsLetGoOfAnIdleMachine: a guest's channel serves one host
// connection at a time (QEMU accepts no other while one is open), so two
// clusterd servers sharing a libvirtd take turns: once the first has been
// idle for its Idle, its connection is closed and the second server's
// request, waiting meanwhile, is answered.
func TestSocketAgentsLetGoOfAnIdleMachine(t *testing.T) {
	dir := t.TempDir()
	// Served until the host closes it; the next waits in the backlog.
	fakeGuest(t, dir, "m1", func(conn net.Conn) { answer(conn, nil) })
	first, second := libvirt.NewSocketAgents(dir), libvirt.NewSocketAgents(dir)
	first.Idle = 100 * time.Millisecond
	t.Cleanup(func() { _ = first.Close(); _ = second.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 2 {
		if _, err := first.Do(ctx, "m1", agent.Request{Op: agent.OpStatus}); err != nil {
			t.Fatalf("the first server's request %d: %v", i, err)
		}
	}
	if resp, err := second.Do(ctx, "m1", agent.Request{Op: agent.OpStatus}); err != nil || resp.Status.Machine != "m1" {
		t.Fatalf("the second server's request, once the first is idle: %+v, %v", resp, err)
	}
}

// TestSocketAgentsSendAgainSoonOnANewConnection: the first request on a
// new connection may reach a guest whose agent is closing its port, and
// be lost; it is sent again after FirstRetry, not Retry, and answered.
func TestSocketAgentsSendAgainSoonOnANewConnection(t *testing.T) {
	dir := t.TempDir()
	fakeGuest(t, dir, "m1", func(conn net.Conn) {
		answer(conn, func(n int) bool { return n == 0 }) // lost: each connection's first line
	})
	a := libvirt.NewSocketAgents(dir)
	a.Retry, a.FirstRetry, a.Idle = time.Hour, 50*time.Millisecond, 50*time.Millisecond
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 2 {
		if i == 1 {
			time.Sleep(200 * time.Millisecond) // idle: the next request dials again
		}
		if resp, err := a.Do(ctx, "m1", agent.Request{Op: agent.OpStatus}); err != nil || resp.Status.Machine != "m1" {
			t.Fatalf("request %d, its first sending lost: %+v, %v", i, resp, err)
		}
	}
}

// fakeGuest listens on machine's agent socket in dir and serves each
// connection with serve, one at a time as QEMU's channel does, until the
// test ends. It counts the connections it accepted.
func fakeGuest(t *testing.T, dir, machine string, serve func(net.Conn)) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("unix", libvirt.AgentSocket(dir, machine))
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			serve(conn)
			conn.Close()
		}
	}()
	return &conns
}

// answer answers every request line on conn as a joined-nowhere agent of
// machine m1 would, but the lines lose says are lost (read and dropped),
// until the host closes the connection.
func answer(conn net.Conn, lose func(line int) bool) {
	sc := bufio.NewScanner(conn)
	for n := 0; sc.Scan(); n++ {
		if lose != nil && lose(n) {
			continue
		}
		var req agent.Request
		_ = json.Unmarshal(sc.Bytes(), &req)
		_ = json.NewEncoder(conn).Encode(agent.Response{ID: req.ID, OK: true, Status: agent.Status{Machine: "m1"}})
	}
}

// TestSocketAgentsTellOfASilentAgent: a request its agent never answers
// is logged while it waits (every SlowAfter), naming the machine and the
// socket, and ends with its context.
func TestSocketAgentsTellOfASilentAgent(t *testing.T) {
	dir := t.TempDir()
	fakeGuest(t, dir, "m1", func(conn net.Conn) { answer(conn, func(int) bool { return true }) })
	var logged syncbuf.Buffer
	a := libvirt.NewSocketAgents(dir)
	a.Retry, a.FirstRetry, a.SlowAfter = 50*time.Millisecond, 50*time.Millisecond, 200*time.Millisecond
	a.Log = slog.New(slog.NewTextHandler(&logged, nil))
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := a.Do(ctx, "m1", agent.Request{Op: agent.OpStatus}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request to a silent agent: %v; want its deadline", err)
	}
	out := logged.String()
	if n := strings.Count(out, "a node agent has not answered yet"); n < 2 || !strings.Contains(out, "machine=m1") ||
		!strings.Contains(out, libvirt.AgentSocket(dir, "m1")) {
		t.Errorf("logged %d warnings:\n%s\nwant at least 2 (every SlowAfter in 2s), naming machine m1 and its socket", n, out)
	}
}
