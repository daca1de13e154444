package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"

	"github.com/clusterd/clusterd/infra"
)

// Receipt is what a simulated node was handed of its cluster's credentials
// at its last join: fingerprints, never the key itself (the simulator keeps
// it in memory only, and would not store a key in the clear anyway).
type Receipt struct {
	// CACert is the SHA-256 (hex) of the CA certificate's PEM, "" if none.
	CACert string
	// CAKey says whether the CA's key was handed over (a control node's
	// init); CAKeySum is the SHA-256 (hex) of its PEM, for a test to compare.
	CAKey    bool
	CAKeySum string
	// Joins counts the machine's successful joins.
	Joins int
}

// receipts is the simulator's in-memory record of what joins were handed,
// by machine. It is per process, as a node's disk would be per node.
type receipts struct {
	mu sync.Mutex
	by map[string]Receipt
}

func newReceipts() *receipts { return &receipts{by: map[string]Receipt{}} }

func (r *receipts) record(machine string, creds infra.NodeCredentials) {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.by[machine]
	got.CACert, got.CAKey, got.CAKeySum = fingerprint(creds.CACert), len(creds.CAKey) > 0, fingerprint(creds.CAKey)
	got.Joins++
	r.by[machine] = got
}

// Received is what machine was handed of its cluster's credentials at its
// last join on this simulator (ok false: it never joined here), so tests
// can check the bootstrap hand-off.
func (s *Simulator) Received(machine string) (r Receipt, ok bool) {
	s.received.mu.Lock()
	defer s.received.mu.Unlock()
	r, ok = s.received.by[machine]
	return r, ok
}

// Fingerprint is how Receipt names a PEM block: its SHA-256, hex.
func Fingerprint(pem []byte) string { return fingerprint(pem) }

func fingerprint(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
