package libvirt

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
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

// SocketAgents dials the host end of a machine's agent channel,
// <Dir>/clusterd-<machine>.agent, for each request.
type SocketAgents struct {
	Dir string
}

var socketIDs atomic.Int64

// Do sends req and reads its response; ctx bounds both.
func (a SocketAgents) Do(ctx context.Context, machineID string, req AgentRequest) (AgentResponse, error) {
	path := AgentSocket(a.Dir, machineID)
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", path)
	if err != nil {
		return AgentResponse{}, fmt.Errorf("agent of machine %s: dial %s: %w", machineID, path, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	req.ID = socketIDs.Add(1)
	b, err := json.Marshal(req)
	if err != nil {
		return AgentResponse{}, fmt.Errorf("agent of machine %s: encode %s: %w", machineID, req.Op, err)
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return AgentResponse{}, fmt.Errorf("agent of machine %s: send %s: %w", machineID, req.Op, ctxOr(ctx, err))
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		var resp AgentResponse
		if err := json.Unmarshal(sc.Bytes(), &resp); err != nil {
			return AgentResponse{}, fmt.Errorf("agent of machine %s: decode answer to %s: %w", machineID, req.Op, err)
		}
		if resp.ID != req.ID {
			continue // an answer to an earlier, abandoned request
		}
		return answer(machineID, req, resp)
	}
	err = sc.Err()
	if err == nil {
		err = errors.New("connection closed")
	}
	return AgentResponse{}, fmt.Errorf("agent of machine %s: read answer to %s: %w", machineID, req.Op, ctxOr(ctx, err))
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
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
