package libvirt_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clusterd/clusterd/infra/libvirt"
)

// TestSocketAgentsSpeakTheProtocol: a request is one JSON line on the
// machine's channel socket; the answer with the request's id is returned
// (an earlier request's answer is skipped), and a refusal is ErrAgent with
// the agent's message.
func TestSocketAgentsSpeakTheProtocol(t *testing.T) {
	dir := t.TempDir()
	const machine = "m1"
	ln, err := net.Listen("unix", libvirt.AgentSocket(dir, machine))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	var mu sync.Mutex
	var seen []libvirt.AgentRequest
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			sc := bufio.NewScanner(conn)
			if sc.Scan() {
				var req libvirt.AgentRequest
				_ = json.Unmarshal(sc.Bytes(), &req)
				mu.Lock()
				seen = append(seen, req)
				mu.Unlock()
				enc := json.NewEncoder(conn)
				_ = enc.Encode(libvirt.AgentResponse{ID: req.ID - 1, OK: true, Status: libvirt.AgentStatus{Version: "stale"}})
				resp := libvirt.AgentResponse{ID: req.ID, OK: req.Op != libvirt.OpJoin, Status: libvirt.AgentStatus{Machine: machine, Version: "1.30.2", Joined: true}}
				if !resp.OK {
					resp.Error = "the attached ISO holds 1.29.9, not 1.30.2"
				}
				_ = enc.Encode(resp)
			}
			conn.Close()
		}
	}()
	a := libvirt.SocketAgents{Dir: dir}
	resp, err := a.Do(context.Background(), machine, libvirt.AgentRequest{Op: libvirt.OpStatus, Cluster: "c1"})
	if err != nil || resp.Status.Version != "1.30.2" || !resp.Status.Joined || resp.Status.Machine != machine {
		t.Fatalf("status: %+v, %v", resp, err)
	}
	_, err = a.Do(context.Background(), machine, libvirt.AgentRequest{Op: libvirt.OpJoin, Cluster: "c1", Version: "1.30.2"})
	if !errors.Is(err, libvirt.ErrAgent) || !contains(err.Error(), "holds 1.29.9") {
		t.Fatalf("refused join: %v; want ErrAgent with the agent's message", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0].Op != "status" || seen[0].Cluster != "c1" || seen[1].Version != "1.30.2" {
		t.Fatalf("the agent got %+v", seen)
	}
	if _, err := a.Do(context.Background(), "nobody", libvirt.AgentRequest{Op: libvirt.OpStatus}); err == nil {
		t.Fatalf("a machine without a socket answered (%s)", filepath.Join(dir, "clusterd-nobody.agent"))
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
