package auth

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrNoIdentities is a token file with no identity line (empty, or only
// comments and blank lines).
var ErrNoIdentities = errors.New("the file holds no identity (a token file needs at least one `sha256:<hex> <account> <role>` line)")

// maxTokenLen bounds a presented token: longer ones are refused before they
// are hashed.
const maxTokenLen = 4096

// Tokens is the table of the --auth-tokens file: the SHA-256 of each token
// with the account and role it stands for. Tokens themselves are never
// stored, so the file can be read by operators without leaking credentials.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	hash    [sha256.Size]byte
	account string
	role    Role
}

// Len is how many identities the table holds.
func (t *Tokens) Len() int { return len(t.entries) }

// LoadTokens reads a token file (see ParseTokens). A file without a single
// identity is an error like a malformed one: loaded, it would lock every
// caller out, and it is far likelier a file truncated or emptied by mistake
// (while being rewritten, say) than an operator's wish.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth tokens: %w", err)
	}
	defer f.Close()
	t, err := ParseTokens(f)
	if err != nil {
		return nil, fmt.Errorf("auth tokens %s: %w", path, err)
	}
	if t.Len() == 0 {
		return nil, fmt.Errorf("auth tokens %s: %w", path, ErrNoIdentities)
	}
	return t, nil
}

// ParseTokens reads one identity a line:
//
//	sha256:<64 hex digits of the token's SHA-256> <account> <role>
//
// where role is user or admin. Blank lines and lines starting with # are
// ignored. Any other line is an error naming its line number, so a typo
// never silently drops an identity.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{}
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: want `sha256:<hex> <account> <role>`, got %d fields", n, len(fields))
		}
		digest, ok := strings.CutPrefix(fields[0], "sha256:")
		raw, err := hex.DecodeString(digest)
		if !ok || err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("line %d: the token must be given as sha256:<64 hex digits of its SHA-256>", n)
		}
		e := tokenEntry{account: fields[1], role: Role(fields[2])}
		copy(e.hash[:], raw)
		if !ValidAccount(e.account) {
			return nil, fmt.Errorf("line %d: account %.64q is not a DNS label (lower-case letters, digits, '-'; at most 63)", n, e.account)
		}
		if e.role != RoleUser && e.role != RoleAdmin {
			return nil, fmt.Errorf("line %d: role %.16q must be user or admin", n, e.role)
		}
		if first, dup := seen[e.hash]; dup {
			return nil, fmt.Errorf("line %d: the same token as line %d", n, first)
		}
		seen[e.hash] = n
		t.entries = append(t.entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

// Lookup returns the identity a presented token stands for. It hashes the
// token and compares the hash with every entry in constant time, so the time
// taken says nothing about how close a guess came.
func (t *Tokens) Lookup(token string) (Identity, bool) {
	if t == nil || token == "" || len(token) > maxTokenLen {
		return Identity{}, false
	}
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i := range t.entries {
		if subtle.ConstantTimeCompare(sum[:], t.entries[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Identity{}, false
	}
	e := t.entries[found]
	return Identity{Account: e.account, Role: e.role, All: e.role == RoleAdmin,
		Subject: "token sha256:" + hex.EncodeToString(e.hash[:4])}, true
}
