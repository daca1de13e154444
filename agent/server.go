package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Store keeps the node's state across restarts: the guest's is its disk
// (DiskStore), tests and in-process fakes use MemStore. Load returns nil
// and no error when nothing was ever saved.
type Store interface {
	Load() ([]byte, error)
	Save(data []byte) error
}

// ISOReader reads the version held by the ISO attached to the machine, at
// the moment of the call (the host may swap the ISO between requests). It
// returns an error when no ISO is attached or it holds no version.
type ISOReader interface {
	Version() (string, error)
}

// ISOFunc adapts a function to ISOReader, for fakes whose "attached ISO"
// is a field of their own.
type ISOFunc func() (string, error)

// Version calls f.
func (f ISOFunc) Version() (string, error) { return f() }

// MemStore is a Store in memory, for tests and for fake machines that live
// in the host's process. The zero value is empty and ready.
type MemStore struct {
	mu   sync.Mutex
	data []byte
}

// Load returns a copy of what was saved last.
func (m *MemStore) Load() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.data), nil
}

// Save replaces the stored bytes with a copy of data.
func (m *MemStore) Save(data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.data = slices.Clone(data)
	return nil
}

// Config is what one agent serves from.
type Config struct {
	// State keeps the node's state; every request reads it and every change
	// is saved before the response is sent.
	State Store
	// ISO reads the attached ISO's version.
	ISO ISOReader
	// Machine is the machine id reported in Status.
	Machine string
	// PKIDir, when set, is where a join's cluster CA is written: ca.crt
	// (0644) and, on a control node, ca.key (0600), kubeadm's
	// /etc/kubernetes/pki layout. Empty: the CA is not kept (an in-process
	// stand-in for a guest).
	PKIDir string
}

// nodeState is what the agent saves in its Store.
type nodeState struct {
	Cluster  string   `json:"cluster,omitempty"`
	Version  string   `json:"version,omitempty"`
	Joined   bool     `json:"joined,omitempty"`
	Cordoned bool     `json:"cordoned,omitempty"`
	Addons   []string `json:"addons,omitempty"`
}

// maxLine bounds a request line, so a peer sending garbage without a
// newline cannot grow the agent's memory without end.
const maxLine = 64 << 10

// Serve answers requests read from rw until rw reaches EOF (the host went
// away: it returns nil) or ctx is done (it returns ctx's error; when rw is
// an io.Closer it is closed to unblock the read). Requests are answered one
// at a time, in order.
func Serve(ctx context.Context, rw io.ReadWriter, cfg Config) error {
	if cfg.State == nil || cfg.ISO == nil {
		return errors.New("agent: Config needs State and ISO")
	}
	if c, ok := rw.(io.Closer); ok {
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
	}
	r := bufio.NewReaderSize(rw, 4096)
	w := bufio.NewWriter(rw)
	for {
		line, err := readLine(r)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("agent: read request: %w", err)
		}
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		resp := handleLine(cfg, line)
		out, err := json.Marshal(resp)
		if err != nil {
			return fmt.Errorf("agent: encode response %d: %w", resp.ID, err)
		}
		if _, err := w.Write(append(out, '\n')); err == nil {
			err = w.Flush()
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("agent: write response %d: %w", resp.ID, err)
		}
	}
}

// readLine reads one newline-terminated line (without the newline). A line
// longer than maxLine is consumed and returned as an error-free "too long"
// marker (a line that is not JSON), so the connection stays in step.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLong {
			line = append(line, chunk...)
			if len(line) > maxLine {
				tooLong, line = true, []byte("line too long")
			}
		}
		switch {
		case err == nil:
			return []byte(strings.TrimSuffix(string(line), "\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// handleLine decodes and runs one request. It never fails: what goes wrong
// is the response's error.
func handleLine(cfg Config, line []byte) Response {
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		return Response{Error: fmt.Sprintf("bad request: %v", err)}
	}
	return Handle(cfg, req)
}

// Handle runs one request against cfg's state as Serve does for a line, so
// an in-process stand-in for a guest (libvirt's test driver runs none)
// keeps exactly the agent's rules. It never fails: what goes wrong is the
// response's error, and a refused request changes nothing.
func Handle(cfg Config, req Request) Response {
	st, err := loadState(cfg.State)
	if err != nil {
		return Response{ID: req.ID, Error: err.Error()}
	}
	resp := Response{ID: req.ID}
	next, kubeconfig, err := apply(cfg, st, req)
	if err == nil && req.Op == OpJoin {
		err = storePKI(cfg.PKIDir, req)
	}
	if err == nil && !stateEqual(st, next) {
		if err = saveState(cfg.State, next); err == nil {
			st = next
		}
	}
	resp.Status = status(cfg, st)
	if err != nil {
		resp.Error = err.Error()
		return resp
	}
	resp.OK = true
	resp.Kubeconfig = kubeconfig
	return resp
}

// apply is one op's decision: the state after req, and the kubeconfig for
// OpKubeconfig. It reads the ISO but changes nothing itself.
func apply(cfg Config, st nodeState, req Request) (nodeState, string, error) {
	next := st
	next.Addons = slices.Clone(st.Addons)
	switch req.Op {
	case OpStatus:
		return st, "", nil
	case OpJoin:
		if req.Cluster == "" || req.Version == "" {
			return st, "", errors.New("join needs cluster and version")
		}
		if st.Joined && st.Cluster != req.Cluster {
			return st, "", fmt.Errorf("joined to cluster %q: leave it first", st.Cluster)
		}
		if st.Joined && st.Version != req.Version {
			return st, "", fmt.Errorf("joined at version %q: upgrade instead", st.Version)
		}
		if err := install(cfg, &next, req.Version); err != nil {
			return st, "", err
		}
		if !st.Joined {
			next.Cluster, next.Joined, next.Cordoned, next.Addons = req.Cluster, true, false, nil
		}
		return next, "", nil
	case OpUpgrade:
		if req.Version == "" {
			return st, "", errors.New("upgrade needs version")
		}
		if !st.Joined {
			return st, "", errors.New("not joined to a cluster")
		}
		if err := install(cfg, &next, req.Version); err != nil {
			return st, "", err
		}
		next.Cordoned = false
		return next, "", nil
	case OpDrain, OpUncordon:
		if !st.Joined {
			return st, "", errors.New("not joined to a cluster")
		}
		next.Cordoned = req.Op == OpDrain
		return next, "", nil
	case OpLeave:
		next.Cluster, next.Joined, next.Cordoned, next.Addons = "", false, false, nil
		return next, "", nil
	case OpKubeconfig:
		if !st.Joined {
			return st, "", errors.New("not joined to a cluster")
		}
		return st, kubeconfig(cfg.Machine, st.Cluster), nil
	case OpDeploy:
		if req.Name != AddonProvider && req.Name != AddonAutoscaler {
			return st, "", fmt.Errorf("unknown add-on %q (want %q or %q)", req.Name, AddonProvider, AddonAutoscaler)
		}
		if !st.Joined {
			return st, "", errors.New("not joined to a cluster")
		}
		if !slices.Contains(next.Addons, req.Name) {
			next.Addons = append(next.Addons, req.Name)
			slices.Sort(next.Addons)
		}
		return next, "", nil
	default:
		return st, "", fmt.Errorf("unknown op %q", req.Op)
	}
}

// install makes version the installed one: nothing to do when it already
// is, otherwise the attached ISO must hold it.
func install(cfg Config, st *nodeState, version string) error {
	if st.Version == version {
		return nil
	}
	iso, err := cfg.ISO.Version()
	if err != nil {
		return fmt.Errorf("install %s: read the attached ISO: %w", version, err)
	}
	if iso != version {
		return fmt.Errorf("install %s: the attached ISO holds version %q", version, iso)
	}
	st.Version = version
	return nil
}

func status(cfg Config, st nodeState) Status {
	iso, err := cfg.ISO.Version()
	if err != nil {
		iso = ""
	}
	return Status{
		Machine:    cfg.Machine,
		Cluster:    st.Cluster,
		Version:    st.Version,
		ISOVersion: iso,
		Joined:     st.Joined,
		Cordoned:   st.Cordoned,
	}
}

// kubeconfig is the admin kubeconfig a real control plane would hand out
// for cluster, pointing at machine's API server. Names are JSON-quoted,
// which YAML reads as plain strings whatever they hold.
func kubeconfig(machine, cluster string) string {
	c, m := strconv.Quote(cluster), strconv.Quote("https://"+machine+":6443")
	user := strconv.Quote("admin@" + cluster)
	return "apiVersion: v1\nkind: Config\n" +
		"clusters:\n- name: " + c + "\n  cluster:\n    server: " + m + "\n" +
		"users:\n- name: " + user + "\n  user: {}\n" +
		"contexts:\n- name: " + c + "\n  context:\n    cluster: " + c + "\n    user: " + user + "\n" +
		"current-context: " + c + "\n"
}

func loadState(s Store) (nodeState, error) {
	var st nodeState
	data, err := s.Load()
	if err != nil {
		return st, fmt.Errorf("load state: %w", err)
	}
	if len(data) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("load state: %w", err)
	}
	return st, nil
}

func saveState(s Store, st nodeState) error {
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := s.Save(data); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

func stateEqual(a, b nodeState) bool {
	return a.Cluster == b.Cluster && a.Version == b.Version && a.Joined == b.Joined &&
		a.Cordoned == b.Cordoned && slices.Equal(a.Addons, b.Addons)
}

// storePKI writes a join's cluster CA under dir (see Config.PKIDir), each
// file through a temporary one renamed over it, so a node never holds half
// a key. Nothing to do without dir or without a CA in the request.
func storePKI(dir string, req Request) error {
	if dir == "" || req.CACert == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("store the cluster CA: %w", err)
	}
	files := []struct {
		name string
		data string
		mode os.FileMode
	}{{"ca.crt", req.CACert, 0o644}}
	if req.CAKey != "" {
		files = append(files, struct {
			name string
			data string
			mode os.FileMode
		}{"ca.key", req.CAKey, 0o600})
	}
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("store the cluster CA: %w", err)
		}
		if err := os.Chmod(tmp, f.mode); err != nil {
			return fmt.Errorf("store the cluster CA: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("store the cluster CA: %w", err)
		}
	}
	return nil
}
