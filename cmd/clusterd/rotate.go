package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/secrets"
	"github.com/clusterd/clusterd/service"
)

// rotateSecrets is `clusterd rotate-secrets`: it seals every cluster
// secret not under the key file's current key again under it
// (service.RotateSecrets), printing the counts. Run it after putting the
// new key first in the key file and restarting the servers; it is safe
// beside them and again after an interruption. Flags have CLUSTERD_*
// twins, as the server's.
func rotateSecrets(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("clusterd rotate-secrets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keyFile := fs.String("secrets-key-file", "", "the key file, the new key first and the old ones below it (required)")
	database := fs.String("database", "sqlite:clusterd.db", "database: sqlite:<path> or mysql://user:pass@host:port/db")
	batch := fs.Int("batch-size", 100, "rows read and resealed per batch")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: clusterd rotate-secrets --secrets-key-file F [--database D] [--batch-size N]\n\n"+
			"Seals again, under the key file's first (current) key, every cluster secret sealed under another key.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("rotate-secrets: unexpected arguments: %v", fs.Args())
	}
	if err := envTwins(fs, getenv, "secrets-key-file", "database"); err != nil {
		return fmt.Errorf("rotate-secrets: %w", err)
	}
	if *keyFile == "" {
		return errors.New("rotate-secrets: --secrets-key-file is required")
	}
	keys, err := secrets.LoadKeyFile(*keyFile)
	if err != nil {
		return fmt.Errorf("rotate-secrets: %w", err)
	}
	openCtx, cancel := context.WithTimeout(ctx, time.Minute)
	store, err := repository.Open(openCtx, *database)
	cancel()
	if err != nil {
		return fmt.Errorf("rotate-secrets: %w", err)
	}
	defer store.Close()
	fmt.Fprintf(stdout, "rotating cluster secrets to key %s (the key file also reads %v)\n", keys.Current(), keys.IDs()[1:])
	n, err := service.RotateSecrets(ctx, store, keys, *batch, func(n service.RotationCounts) {
		fmt.Fprintf(stdout, "  resealed %d, skipped %d, failed %d so far\n", n.Resealed, n.Skipped, n.Failed)
	})
	fmt.Fprintf(stdout, "resealed %d, skipped %d (changed meanwhile), failed %d (did not open)\n", n.Resealed, n.Skipped, n.Failed)
	if err != nil {
		return fmt.Errorf("rotate-secrets: %w", err)
	}
	return nil
}
