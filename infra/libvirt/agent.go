package libvirt

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Agent operations (AgentRequest.Op).
const (
	OpStatus     = "status"
	OpJoin       = "join"
	OpUpgrade    = "upgrade"
	OpDrain      = "drain"
	OpUncordon   = "uncordon"
	OpLeave      = "leave"
	OpKubeconfig = "kubeconfig"
	OpDeploy     = "deploy"
)

// AgentRequest is one request to a node agent: one JSON object on a line.
// join installs the version found on the attached ISO (an error if the ISO
// holds another) and joins the cluster; upgrade does the same and
// uncordons; leave removes the node from its cluster (delete_node); deploy
// deploys Name ("provider" or "autoscaler").
type AgentRequest struct {
	ID      int64  `json:"id"`
	Op      string `json:"op"`
	Cluster string `json:"cluster,omitempty"`
	Version string `json:"version,omitempty"`
	Name    string `json:"name,omitempty"`
}

// AgentStatus is what a node agent reports of its node.
type AgentStatus struct {
	Machine    string `json:"machine"`
	Cluster    string `json:"cluster"`
	Version    string `json:"version"`
	ISOVersion string `json:"iso_version"`
	Joined     bool   `json:"joined"`
	Cordoned   bool   `json:"cordoned"`
}

// AgentResponse answers the AgentRequest with the same ID: one JSON object
// on a line.
type AgentResponse struct {
	ID         int64       `json:"id"`
	OK         bool        `json:"ok"`
	Error      string      `json:"error"`
	Status     AgentStatus `json:"status"`
	Kubeconfig string      `json:"kubeconfig"`
}

// Agents reaches the node agent of a machine. Do returns the agent's
// response; a response that is not ok is an error carrying the agent's
// message (ErrAgent).
type Agents interface {
	Do(ctx context.Context, machineID string, req AgentRequest) (AgentResponse, error)
}

// ErrAgent: the node agent answered and refused the request.
var ErrAgent = errors.New("node agent refused")

// SocketAgents talks to each machine's agent over the host end of its
// channel, <dir>/clusterd-<machine>.agent, keeping one connection per
// machine while it is in use: the guest's end is a single port, which drops
// what it has not read when a host connection ends, so a connection per
// request could lose the next request in that moment. The connection is
// closed once idle for Idle: QEMU serves one connection to the socket at a
// time, so a connection kept open would keep every other clusterd server
// sharing the libvirtd (a peer adopting an operation, or running the next
// one) from the machine's agent. A request unanswered for Retry is sent
// again, on a new connection when its connection broke, until ctx ends:
// every agent request is idempotent, and an answer to an earlier sending
// is told apart by its id. Close closes the connections.
type SocketAgents struct {
	dir string
	// Retry is how long a sending waits for its answer before the request
	// is sent again (default 10s); a guest still booting answers the
	// sending it reads first.
	Retry time.Duration
	// FirstRetry is Retry on a connection that has not answered yet
	// (default 1s): a request that reaches a guest whose agent is closing
	// its port (it reopens it every 200 ms while no host is connected) is
	// lost, and a new connection's first request may.
	FirstRetry time.Duration
	// Idle is how long a machine's connection is kept after its last
	// answer (default 2s): the requests of one step reuse it, and the
	// guest's agent has reopened its port well before a request on the
	// next connection arrives.
	Idle  time.Duration
	ids   atomic.Int64
	mu    sync.Mutex
	conns map[string]*agentConn
}

// agentConn is one machine's connection; its lock orders the machine's
// requests (the protocol answers in order).
type agentConn struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	// answered: the connection has carried an answer.
	answered bool
	// uses counts requests; idle closes the connection unless a request
	// came after the one that armed it.
	uses uint64
	idle *time.Timer
}

// NewSocketAgents returns agents reached through the sockets in dir.
func NewSocketAgents(dir string) *SocketAgents {
	return &SocketAgents{dir: dir, Retry: 10 * time.Second, FirstRetry: time.Second, Idle: 2 * time.Second, conns: map[string]*agentConn{}}
}

func (a *SocketAgents) machine(id string) *agentConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.conns[id]
	if !ok {
		c = &agentConn{}
		a.conns[id] = c
	}
	return c
}

// Forget closes a machine's connection (its domain is gone).
func (a *SocketAgents) Forget(machineID string) {
	a.mu.Lock()
	c, ok := a.conns[machineID]
	delete(a.conns, machineID)
	a.mu.Unlock()
	if ok {
		c.mu.Lock()
		c.close()
		c.mu.Unlock()
	}
}

// Close closes every connection.
func (a *SocketAgents) Close() error {
	a.mu.Lock()
	conns := a.conns
	a.conns = map[string]*agentConn{}
	a.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		c.close()
		c.mu.Unlock()
	}
	return nil
}

func (c *agentConn) close() {
	if c.idle != nil {
		c.idle.Stop()
	}
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.r, c.answered = nil, nil, false
	}
}

// Do sends req to machineID's agent and returns its answer; ctx bounds it.
func (a *SocketAgents) Do(ctx context.Context, machineID string, req AgentRequest) (AgentResponse, error) {
	req.ID = a.ids.Add(1)
	line, err := json.Marshal(req)
	if err != nil {
		return AgentResponse{}, fmt.Errorf("agent of machine %s: encode %s: %w", machineID, req.Op, err)
	}
	line = append(line, '\n')
	c := a.machine(machineID)
	c.mu.Lock()
	c.uses++
	if c.idle != nil {
		c.idle.Stop()
	}
	defer func() {
		if c.conn != nil {
			use := c.uses
			c.idle = time.AfterFunc(a.Idle, func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				if c.uses == use {
					c.close()
				}
			})
		}
		c.mu.Unlock()
	}()
	for {
		wait := a.Retry
		if !c.answered && a.FirstRetry > 0 {
			wait = min(wait, a.FirstRetry)
		}
		resp, err := c.send(ctx, filepath.Join(a.dir, DomainName(machineID)+".agent"), line, req.ID, wait)
		if err == nil {
			return answer(machineID, req, resp)
		}
		if ctx.Err() != nil {
			c.close() // an answer may still come: not on this connection
			return AgentResponse{}, fmt.Errorf("agent of machine %s: %s: %w (last: %v)", machineID, req.Op, ctx.Err(), err)
		}
		if !errors.Is(err, errNoAnswer) {
			// Broken or refused connection: a new one, a little later.
			c.close()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// errNoAnswer: a sending got no answer within its wait.
var errNoAnswer = errors.New("no answer")

// send writes line on the machine's connection (dialled when missing) and
// reads until the answer with id, for at most wait.
func (c *agentConn) send(ctx context.Context, path string, line []byte, id int64, wait time.Duration) (AgentResponse, error) {
	if c.conn == nil {
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, "unix", path)
		if err != nil {
			return AgentResponse{}, fmt.Errorf("dial %s: %w", path, err)
		}
		c.conn, c.r = conn, bufio.NewReaderSize(conn, 64*1024)
	}
	deadline := time.Now().Add(wait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.conn.Write(line); err != nil {
		return AgentResponse{}, fmt.Errorf("send: %w", err)
	}
	for {
		b, err := c.r.ReadBytes('\n')
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return AgentResponse{}, errNoAnswer
		}
		if err != nil {
			return AgentResponse{}, fmt.Errorf("read answer: %w", err)
		}
		var resp AgentResponse
		if err := json.Unmarshal(b, &resp); err != nil || resp.ID != id {
			continue // an answer to an earlier sending, or a line that is not one
		}
		c.answered = true
		return resp, nil
	}
}

// answer turns a refusal into an error.
func answer(machineID string, req AgentRequest, resp AgentResponse) (AgentResponse, error) {
	if !resp.OK {
		return resp, fmt.Errorf("agent of machine %s: %s: %w: %s", machineID, req.Op, ErrAgent, resp.Error)
	}
	return resp, nil
}

// MemoryAgents plays the node agents in process, one per machine, with the
// real agent's rules (a version is installed from the attached ISO unless
// it is installed already; only a joined node is upgraded, drained,
// uncordoned, asked for a kubeconfig or deployed to; a node joined
// elsewhere refuses to join): for libvirt's test driver, whose domains run
// no guest. isoVersion says which version the machine's attached ISO holds
// ("" with none attached), as the real agent finds by mounting it.
type MemoryAgents struct {
	isoVersion func(ctx context.Context, machineID string) (string, error)
	mu         sync.Mutex
	nodes      map[string]AgentStatus
}

// NewMemoryAgents returns agents that read the attached ISO's version with
// isoVersion (Driver.ISOVersion).
func NewMemoryAgents(isoVersion func(ctx context.Context, machineID string) (string, error)) *MemoryAgents {
	return &MemoryAgents{isoVersion: isoVersion, nodes: map[string]AgentStatus{}}
}

// Forget drops a machine's state, as destroying its disk does.
func (a *MemoryAgents) Forget(machineID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.nodes, machineID)
}

// Do answers req as machineID's agent would.
func (a *MemoryAgents) Do(ctx context.Context, machineID string, req AgentRequest) (AgentResponse, error) {
	if err := ctx.Err(); err != nil {
		return AgentResponse{}, err
	}
	iso, err := a.isoVersion(ctx, machineID)
	if err != nil {
		return AgentResponse{}, fmt.Errorf("agent of machine %s: read the ISO: %w", machineID, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.nodes[machineID]
	st.Machine, st.ISOVersion = machineID, iso
	resp := AgentResponse{ID: req.ID, OK: true}
	// install makes version the installed one: nothing to do when it is
	// already, otherwise the attached ISO must hold it.
	install := func() bool {
		switch {
		case req.Version == "":
			resp.Error = req.Op + " needs a version"
		case st.Version == req.Version:
			return true
		case iso == "":
			resp.Error = fmt.Sprintf("install %s: no ISO attached", req.Version)
		case iso != req.Version:
			resp.Error = fmt.Sprintf("install %s: the attached ISO holds %s, not %s", req.Version, iso, req.Version)
		default:
			st.Version = req.Version
			return true
		}
		return false
	}
	joined := func() bool {
		if !st.Joined {
			resp.Error = "not joined to a cluster"
		}
		return st.Joined
	}
	switch req.Op {
	case OpStatus:
	case OpJoin:
		switch {
		case req.Cluster == "":
			resp.Error = "join needs a cluster"
		case st.Joined && st.Cluster != req.Cluster:
			resp.Error = fmt.Sprintf("joined to cluster %s: leave it first", st.Cluster)
		case st.Joined && st.Version != req.Version:
			resp.Error = fmt.Sprintf("joined at version %s: upgrade instead", st.Version)
		case install():
			st.Cluster, st.Joined = req.Cluster, true
		}
	case OpUpgrade:
		if joined() && install() {
			st.Cordoned = false
		}
	case OpDrain, OpUncordon:
		if joined() {
			st.Cordoned = req.Op == OpDrain
		}
	case OpLeave:
		st.Cluster, st.Joined, st.Cordoned = "", false, false
	case OpKubeconfig:
		if joined() {
			resp.Kubeconfig = fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: %s\n  cluster:\n    server: https://%s:6443\n", st.Cluster, machineID)
		}
	case OpDeploy:
		if req.Name != "provider" && req.Name != "autoscaler" {
			resp.Error = fmt.Sprintf("unknown add-on %q", req.Name)
		} else {
			joined()
		}
	default:
		resp.Error = fmt.Sprintf("unknown operation %q", req.Op)
	}
	if resp.Error != "" {
		resp.OK = false // and, refused, the request changed nothing
	} else {
		a.nodes[machineID] = st
	}
	resp.Status = st
	return answer(machineID, req, resp)
}
