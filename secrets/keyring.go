// Package secrets encrypts what clusterd keeps of its clusters' credentials
// (CA and admin client keys) before it reaches the database, and makes
// those credentials. Encryption is AES-256-GCM under a key of a keyring read
// from the --secrets-key-file; every sealed value names the id of its key,
// so keys can be rotated (clusterd rotate-secrets) while older values still
// open. The additional data binds a value to its cluster and kind, so a
// ciphertext copied to another row does not open there.
//
// # Key file
//
// One key a line: `<key id> <base64 of 32 random bytes>` (standard
// encoding, with padding). Blank lines and lines starting with '#' are
// ignored. The first key is the current one, which every write uses; the
// others only open what was written under them. A key id is 1 to 64
// letters, digits, '.', '_' or '-'. The file must not be readable by group
// or others (mode 0600 or stricter): a looser file is refused.
//
// To rotate: put a new key on the first line, keep the old ones below it,
// restart (or roll) the servers, run `clusterd rotate-secrets`, and only
// then remove the old keys.
package secrets

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// KeySize is the size of every key: AES-256.
const KeySize = 32

// ErrUnknownKey: a sealed value names a key the keyring does not hold
// (removed from the key file too early, or another deployment's).
var ErrUnknownKey = errors.New("secrets: unknown key id")

// ErrOpen: a sealed value does not open (tampered with, moved to another
// cluster or kind, or sealed under another key of the same id).
var ErrOpen = errors.New("secrets: value does not open (wrong key, tampered with, or not this cluster's)")

// validKeyID is what a key id may be: short and printable, it is stored in
// every sealed row.
var validKeyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Keyring holds the keys of a key file: the current one seals, any opens.
// It is safe for concurrent use (it never changes after it is made).
type Keyring struct {
	current string
	aeads   map[string]cipher.AEAD
	ids     []string
}

// Sealed is one encrypted value as it is stored.
type Sealed struct {
	// KeyID names the key that sealed it.
	KeyID string
	// Nonce is GCM's 12 random bytes, new for every seal.
	Nonce []byte
	// Ciphertext carries GCM's tag at its end.
	Ciphertext []byte
}

// Key is one key of a keyring.
type Key struct {
	ID    string
	Bytes []byte
}

// NewKeyring makes a keyring of keys; the first is current. Ids must be
// valid and distinct, and every key KeySize bytes.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("secrets: no key")
	}
	k := &Keyring{current: keys[0].ID, aeads: map[string]cipher.AEAD{}}
	for _, key := range keys {
		if !validKeyID.MatchString(key.ID) {
			return nil, fmt.Errorf("secrets: key id %q: want 1 to 64 letters, digits, '.', '_' or '-'", key.ID)
		}
		if _, dup := k.aeads[key.ID]; dup {
			return nil, fmt.Errorf("secrets: key id %q appears twice", key.ID)
		}
		if len(key.Bytes) != KeySize {
			return nil, fmt.Errorf("secrets: key %q has %d bytes; want %d", key.ID, len(key.Bytes), KeySize)
		}
		block, err := aes.NewCipher(key.Bytes)
		if err != nil {
			return nil, fmt.Errorf("secrets: key %q: %w", key.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("secrets: key %q: %w", key.ID, err)
		}
		k.aeads[key.ID] = aead
		k.ids = append(k.ids, key.ID)
	}
	return k, nil
}

// Current is the id of the key that seals.
func (k *Keyring) Current() string { return k.current }

// IDs lists the keyring's key ids, the current one first.
func (k *Keyring) IDs() []string { return append([]string(nil), k.ids...) }

// Seal encrypts plaintext under the current key, bound to aad (see AAD).
func (k *Keyring) Seal(plaintext, aad []byte) (Sealed, error) {
	aead := k.aeads[k.current]
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, fmt.Errorf("secrets: nonce: %w", err)
	}
	return Sealed{KeyID: k.current, Nonce: nonce, Ciphertext: aead.Seal(nil, nonce, plaintext, aad)}, nil
}

// Open decrypts s with the key it names; aad must be what it was sealed
// with. A key the keyring lacks is ErrUnknownKey; anything else that does
// not open is ErrOpen.
func (k *Keyring) Open(s Sealed, aad []byte) ([]byte, error) {
	aead, ok := k.aeads[s.KeyID]
	if !ok {
		return nil, fmt.Errorf("%w %q (the key file holds %s)", ErrUnknownKey, s.KeyID, strings.Join(k.ids, ", "))
	}
	if len(s.Nonce) != aead.NonceSize() {
		return nil, fmt.Errorf("%w: nonce of %d bytes", ErrOpen, len(s.Nonce))
	}
	out, err := aead.Open(nil, s.Nonce, s.Ciphertext, aad)
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}

// Reseal opens s and seals it again under the current key (rotation).
func (k *Keyring) Reseal(s Sealed, aad []byte) (Sealed, error) {
	plain, err := k.Open(s, aad)
	if err != nil {
		return Sealed{}, err
	}
	return k.Seal(plain, aad)
}

// AAD is the additional data of a cluster's secret of a kind: a value
// sealed for one cluster and kind opens for no other.
func AAD(clusterID, kind string) []byte {
	return []byte("clusterd/cluster-secret/v1\x00" + clusterID + "\x00" + kind)
}

// ParseKeyFile reads a key file's content (see the package doc).
func ParseKeyFile(data []byte) (*Keyring, error) {
	var keys []Key
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want `<key id> <base64 of %d bytes>`", n, KeySize)
		}
		raw, err := base64.StdEncoding.DecodeString(fields[1])
		if err != nil {
			return nil, fmt.Errorf("line %d (key %q): not base64: %w", n, fields[0], err)
		}
		keys = append(keys, Key{ID: fields[0], Bytes: raw})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in the file")
	}
	return NewKeyring(keys...)
}

// LoadKeyFile reads the key file at path, refusing one that others may read
// or write, or a group may write, or a group may read other than as
// keyFileMode allows.
func LoadKeyFile(path string) (*Keyring, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	fileUID, fileGID := -1, -1
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		fileUID, fileGID = int(st.Uid), int(st.Gid)
	}
	groups, _ := os.Getgroups()
	if err := keyFileMode(info.Mode().Perm(), fileUID, fileGID, append(groups, os.Getegid())); err != nil {
		return nil, fmt.Errorf("secrets key file %s: %w", path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	k, err := ParseKeyFile(data)
	if err != nil {
		return nil, fmt.Errorf("secrets key file %s: %w", path, err)
	}
	return k, nil
}

// NewKey is a fresh random key with an id made from now
// (`k20260102T150405Z`), the line a key file takes for it.
func NewKey(now time.Time) (Key, string, error) {
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return Key{}, "", fmt.Errorf("secrets: new key: %w", err)
	}
	id := "k" + now.UTC().Format("20060102T150405Z")
	return Key{ID: id, Bytes: raw}, id + " " + base64.StdEncoding.EncodeToString(raw) + "\n", nil
}

// CreateKeyFile writes a new key file at path (mode 0600, refusing to
// replace an existing file) holding one fresh key, and returns its keyring.
// Development mode uses it when no key file is given.
func CreateKeyFile(path string, now time.Time) (*Keyring, error) {
	key, line, err := NewKey(now)
	if err != nil {
		return nil, err
	}
	// The key is written to a file of its own and then linked to path, which
	// fails if path exists: a process that finds path never reads it half
	// written.
	f, err := os.CreateTemp(filepath.Dir(path), ".secrets-key-*")
	if err != nil {
		return nil, fmt.Errorf("create secrets key file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	werr := f.Chmod(0o600)
	if werr == nil {
		_, werr = f.WriteString("# clusterd secrets keys: <key id> <base64 of 32 bytes>, the first one current\n" + line)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, fmt.Errorf("write secrets key file %s: %w", path, werr)
	}
	if err := os.Link(tmp, path); err != nil {
		return nil, fmt.Errorf("create secrets key file: %w", err)
	}
	return NewKeyring(key)
}

// LoadOrCreateKeyFile loads the key file at path, creating it first when
// it does not exist; created reports that it did.
func LoadOrCreateKeyFile(path string, now time.Time) (k *Keyring, created bool, err error) {
	k, err = LoadKeyFile(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, false, err
	}
	k, err = CreateKeyFile(path, now)
	if errors.Is(err, fs.ErrExist) { // another process made it first
		k, err = LoadKeyFile(path)
		return k, false, err
	}
	return k, err == nil, err
}

// Ephemeral is a keyring of one random key that lives in memory only: what
// tests and an in-memory database use, since nothing sealed under it
// outlives the process.
func Ephemeral() *Keyring {
	key, _, err := NewKey(time.Now())
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	key.ID = "ephemeral"
	k, err := NewKeyring(key)
	if err != nil {
		panic(err)
	}
	return k
}

// keyFileMode accepts a key file's permissions: no bits for others, no
// group write, and group read only for a file root owns whose group, not
// root's, is one of the server's own groups. That is how Kubernetes mounts
// a Secret for a non-root pod (fsGroup: root-owned files, readable by the
// pod's group); root chose that group for the server. A file of the server's
// own user with group read is refused: a user's group is often shared
// (users). An owner or group it cannot tell (< 0) is refused too.
func keyFileMode(perm os.FileMode, fileUID, fileGID int, ownGroups []int) error {
	switch {
	case perm&0o007 != 0:
		return fmt.Errorf("mode %04o lets others at the keys; chmod 600 it", perm)
	case perm&0o070 == 0:
		return nil
	case perm&0o030 != 0:
		return fmt.Errorf("mode %04o lets a group change the keys; chmod 600 it", perm)
	case fileUID != 0 || fileGID <= 0 || !slices.Contains(ownGroups, fileGID):
		return fmt.Errorf("mode %04o lets group %d read the keys, which is not a group root gave this server (a root-owned file of one of its own groups, as Kubernetes' fsGroup mounts a Secret); chmod 600 it", perm, fileGID)
	}
	return nil
}
