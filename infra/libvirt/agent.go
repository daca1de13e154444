package libvirt

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clusterd/clusterd/agent"
)

// Agents reaches the node agent of a machine. Do returns the agent's
// response; a response that is not ok is an error carrying the agent's
// message (ErrAgent).
type Agents interface {
	Do(ctx context.Context, machineID string, req agent.Request) (agent.Response, error)
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
	Idle time.Duration
	// Log, when set, is told of a request that has gone unanswered for
	// SlowAfter (default 1m), and again every SlowAfter while it waits: a
	// guest that does not boot, or a connection held by another server,
	// shows in the log rather than only as a step that takes long.
	Log       *slog.Logger
	SlowAfter time.Duration
	// Describe, when set, adds what the host knows of the machine to that
	// log line (its domain's state and CPU time, so a guest that stopped
	// running or never ran shows apart from one that runs and ignores us).
	Describe func(machineID string) string
	ids      atomic.Uint64
	mu       sync.Mutex
	conns    map[string]*agentConn
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
	return &SocketAgents{dir: dir, Retry: 10 * time.Second, FirstRetry: time.Second, Idle: 2 * time.Second, SlowAfter: time.Minute,
		conns: map[string]*agentConn{}}
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
func (a *SocketAgents) Do(ctx context.Context, machineID string, req agent.Request) (agent.Response, error) {
	req.ID = a.ids.Add(1)
	line, err := json.Marshal(req)
	if err != nil {
		return agent.Response{}, fmt.Errorf("agent of machine %s: encode %s: %w", machineID, req.Op, err)
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
	path := filepath.Join(a.dir, DomainName(machineID)+".agent")
	began := time.Now()
	warned := began
	for {
		wait := a.Retry
		if !c.answered && a.FirstRetry > 0 {
			wait = min(wait, a.FirstRetry)
		}
		resp, err := c.send(ctx, path, line, req.ID, wait)
		if err == nil {
			return answer(machineID, req, resp)
		}
		if a.Log != nil && a.SlowAfter > 0 && time.Since(warned) >= a.SlowAfter {
			warned = time.Now()
			domain := ""
			if a.Describe != nil {
				domain = a.Describe(machineID)
			}
			a.Log.Warn("a node agent has not answered yet; still sending", "machine", machineID, "op", req.Op,
				"waited", time.Since(began).Round(time.Second), "socket", path, "connected", c.conn != nil,
				"answered_before", c.answered, "channel", socketPeers(path), "domain", domain, "last_error", err.Error())
		}
		if ctx.Err() != nil {
			c.close() // an answer may still come: not on this connection
			return agent.Response{}, fmt.Errorf("agent of machine %s: %s: %w (last: %v)", machineID, req.Op, ctx.Err(), err)
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
func (c *agentConn) send(ctx context.Context, path string, line []byte, id uint64, wait time.Duration) (agent.Response, error) {
	if c.conn == nil {
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, "unix", path)
		if err != nil {
			return agent.Response{}, fmt.Errorf("dial %s: %w", path, err)
		}
		c.conn, c.r = conn, bufio.NewReaderSize(conn, 64*1024)
	}
	deadline := time.Now().Add(wait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.conn.SetDeadline(deadline)
	// The function may still run after stop returns, once the caller has
	// closed the connection and cleared c.conn: it uses its own copy.
	conn := c.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.conn.Write(line); err != nil {
		return agent.Response{}, fmt.Errorf("send: %w", err)
	}
	for {
		b, err := c.r.ReadBytes('\n')
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return agent.Response{}, errNoAnswer
		}
		if err != nil {
			return agent.Response{}, fmt.Errorf("read answer: %w", err)
		}
		var resp agent.Response
		if err := json.Unmarshal(b, &resp); err != nil || resp.ID != id {
			continue // an answer to an earlier sending, or a line that is not one
		}
		c.answered = true
		return resp, nil
	}
}

// answer turns a refusal into an error.
func answer(machineID string, req agent.Request, resp agent.Response) (agent.Response, error) {
	if !resp.OK {
		return resp, fmt.Errorf("agent of machine %s: %s: %w: %s", machineID, req.Op, ErrAgent, resp.Error)
	}
	return resp, nil
}

// MemoryAgents plays the node agents in process, one per machine, with the
// real agent's rules (agent.Handle on a state in memory): for libvirt's
// test driver, whose domains run no guest. isoVersion says which version
// the machine's attached ISO holds ("" with none attached), as the real
// agent finds by mounting it.
type MemoryAgents struct {
	isoVersion func(ctx context.Context, machineID string) (string, error)
	mu         sync.Mutex
	nodes      map[string]*agent.MemStore
}

// NewMemoryAgents returns agents that read the attached ISO's version with
// isoVersion (Driver.ISOVersion).
func NewMemoryAgents(isoVersion func(ctx context.Context, machineID string) (string, error)) *MemoryAgents {
	return &MemoryAgents{isoVersion: isoVersion, nodes: map[string]*agent.MemStore{}}
}

// Forget drops a machine's state, as destroying its disk does.
func (a *MemoryAgents) Forget(machineID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.nodes, machineID)
}

// errNoISO is what a guest's agent finds in a cdrom with no medium.
var errNoISO = errors.New("no ISO attached")

// Do answers req as machineID's agent would.
func (a *MemoryAgents) Do(ctx context.Context, machineID string, req agent.Request) (agent.Response, error) {
	if err := ctx.Err(); err != nil {
		return agent.Response{}, err
	}
	iso, err := a.isoVersion(ctx, machineID)
	if err != nil {
		return agent.Response{}, fmt.Errorf("agent of machine %s: read the ISO: %w", machineID, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	store, ok := a.nodes[machineID]
	if !ok {
		store = &agent.MemStore{}
		a.nodes[machineID] = store
	}
	resp := agent.Handle(agent.Config{
		State:   store,
		Machine: machineID,
		ISO: agent.ISOFunc(func() (string, error) {
			if iso == "" {
				return "", errNoISO
			}
			return iso, nil
		}),
	}, req)
	return answer(machineID, req, resp)
}

// socketPeers says, from /proc/net/unix, how many connections to the unix
// socket at path QEMU has accepted and how many wait in its backlog. QEMU
// serves one connection to a channel's socket at a time: "accepted=1
// waiting=1" while this server's request goes unanswered means another
// process (a peer sharing the libvirtd, or a stopped one) holds the channel.
// Empty where /proc/net/unix cannot be read.
func socketPeers(path string) string {
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return ""
	}
	accepted, waiting := 0, 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		// Num RefCount Protocol Flags Type St Inode Path
		if len(f) < 8 || f[7] != path || f[3] == "00010000" {
			continue // not this socket, or its listener
		}
		switch f[5] {
		case "03":
			accepted++
		case "02":
			waiting++
		}
	}
	return fmt.Sprintf("accepted=%d waiting=%d", accepted, waiting)
}
