package server

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clusterd/clusterd/secrets"
)

// errNoSecretsKey stops a server with identities (not development mode)
// that was given no --secrets-key-file: it would have nothing to encrypt
// its clusters' credentials with.
var errNoSecretsKey = errors.New("config: --secrets-key-file is required when identities are configured: " +
	"it encrypts the clusters' CA and admin keys in the database. Create one, mode 0600, of lines `<key id> <base64 of 32 random bytes>`, e.g. " +
	"(umask 077; echo \"k1 $(head -c 32 /dev/urandom | base64)\" > /etc/clusterd/secrets.key)")

// loadSecrets is the keyring of the --secrets-key-file, read before the
// database is opened so that a bad file stops the start at once. Without
// one, only a development-mode server goes on (nil: devSecrets, once the
// database is open); any other refuses to start (errNoSecretsKey).
func loadSecrets(cfg Config, devMode bool) (*secrets.Keyring, error) {
	if cfg.SecretsKeyFile != "" {
		k, err := secrets.LoadKeyFile(cfg.SecretsKeyFile)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		return k, nil
	}
	if !devMode {
		return nil, errNoSecretsKey
	}
	return nil, nil
}

// devSecrets is the keyring of a development-mode server given no key
// file: the one of DevSecretsKeyPath, created 0600 the first time (and
// logged), or, for an in-memory database, a key in memory.
func devSecrets(cfg Config, log *slog.Logger) (*secrets.Keyring, error) {
	path := DevSecretsKeyPath(cfg.Database)
	if path == "" {
		log.Warn("development mode without --secrets-key-file: the clusters' credentials are sealed under a key kept in memory only (in-memory database)")
		return secrets.Ephemeral(), nil
	}
	if !strings.HasPrefix(cfg.Database, "sqlite:") {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("development secrets key: %w", err)
		}
	}
	k, created, err := secrets.LoadOrCreateKeyFile(path, time.Now())
	if err != nil {
		return nil, fmt.Errorf("development secrets key: %w", err)
	}
	if created {
		log.Warn("development mode without --secrets-key-file: created a secrets key file for the clusters' credentials; keep it with the database", "path", path)
	} else {
		log.Info("development mode without --secrets-key-file: using the development secrets key file", "path", path)
	}
	return k, nil
}

// DevSecretsKeyPath is the key file a development-mode server uses when
// given none: beside an embedded SQLite database, `<database file>.secrets-key`;
// for MySQL, `clusterd/dev-secrets-key` in the user's configuration folder
// (os.UserConfigDir), so every development server of the user shares it.
// An in-memory database gets none ("": a key in memory suffices).
func DevSecretsKeyPath(database string) string {
	if path, ok := strings.CutPrefix(database, "sqlite:"); ok {
		file, query, _ := strings.Cut(path, "?")
		if strings.Contains(file, ":memory:") || strings.Contains(query, "mode=memory") {
			return ""
		}
		return strings.TrimPrefix(file, "file:") + ".secrets-key"
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "clusterd", "dev-secrets-key")
}
