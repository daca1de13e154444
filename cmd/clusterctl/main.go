// Command clusterctl drives clusterd from a terminal: every ClusterLifecycle
// and Operations RPC is a command (clusterctl create, get, list, start, stop,
// scale, upgrade, add-nodes, remove-nodes, delete, events, operations
// list|get|wait|cancel), and so is every Catalog RPC (clusterctl versions
// and offerings, with get, create, update and delete), built on the Go
// client package (client/).
//
// Output is a table (-o wide: more columns), or the resource's protojson
// (-o json), as YAML (-o yaml), its name (-o name) or a kubectl-like
// jsonpath template (-o jsonpath=...). Every mutation takes --wait, which
// follows the operation to its end: a progress bar on a terminal, plain
// lines otherwise, on stderr so that stdout holds only the result. Failures
// exit 1 with one line in the command line's words and the error's
// ErrorInfo reason; usage mistakes exit 2. Every global flag has an
// environment twin (--server is CLUSTERCTL_SERVER), and a context of the
// configuration file (clusterctl config) fills in what neither sets.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"

	"github.com/clusterd/clusterd/client"
	"github.com/clusterd/clusterd/version"
)

// Exit codes.
const (
	exitOK = 0
	// exitFailed: the server refused the request, or the operation failed.
	exitFailed = 1
	// exitUsage: the command line is wrong (unknown flag, missing argument).
	exitUsage = 2
	// exitInterrupted: Ctrl-C while waiting; the operation goes on.
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is clusterctl: it parses args (with the environment twins of the
// global flags from getenv), runs the command and returns the exit code.
// stdin answers a confirmation when it is a terminal. Tests call it
// in-process.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv, named: map[string]string{}, now: time.Now}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if a.client != nil {
		_ = a.client.Close()
	}
	if err == nil {
		return exitOK
	}
	cmd, _, ferr := root.Find(args)
	if ferr != nil {
		cmd = root
	}
	return a.report(ctx, cmd, err)
}

// app is one run of clusterctl: where it writes and what it connects with.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	server, token, tokenFile, account             string
	configFile, contextName                       string
	useTLS                                        bool
	tlsCA, tlsCert, tlsKey, tlsServerName, output string
	timeout                                       durationFlag

	client *client.Client
	// named maps the resource names of the clusters this run looked up
	// to the user's own words for them (clusters/{uuid} -> demo), for
	// messages.
	named map[string]string
	// now is the clock of ages and durations.
	now func() time.Time
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "clusterctl",
		Short: "Drive clusterd: create, change and follow Kubernetes clusters",
		Long: "clusterctl drives a clusterd server over gRPC.\n\n" +
			"Every global flag has an environment twin: --server is CLUSTERCTL_SERVER, --token CLUSTERCTL_TOKEN,\n" +
			"--tls-ca CLUSTERCTL_TLS_CA, and so on; a flag on the command line wins, and the context in use\n" +
			"(clusterctl config) fills in what neither sets.\n" +
			"A CLUSTER is clusters/{uuid}, the bare uuid, or the cluster's display name.",
		Version:       version.Get().String("clusterctl"),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noSubcommand,
		RunE:          func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.applyEnvironment(cmd.Root().PersistentFlags(), cmd.Flags())
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := root.PersistentFlags()
	f.StringVar(&a.server, "server", "127.0.0.1:9090", "clusterd's gRPC address: host:port, or a URL (https:// and grpcs:// are TLS, http:// and grpc:// plaintext)")
	f.StringVar(&a.token, "token", "", "bearer token (a server started with --auth-tokens)")
	f.StringVar(&a.tokenFile, "token-file", "", "read the bearer token from this file (--token wins)")
	f.StringVar(&a.configFile, "config", "", "the configuration file of contexts (default $XDG_CONFIG_HOME/clusterctl/config or ~/.config/clusterctl/config)")
	f.StringVar(&a.contextName, "context", "", "the context to use instead of the current one (clusterctl config get-contexts)")
	f.StringVar(&a.account, "account", "", "the account to act for: an admin's, or anyone's in development mode (x-clusterd-account)")
	f.BoolVar(&a.useTLS, "tls", false, "connect over TLS, trusting the system's CAs (implied by the other --tls-* flags)")
	f.StringVar(&a.tlsCA, "tls-ca", "", "PEM CA bundle to verify the server with, instead of the system's")
	f.StringVar(&a.tlsCert, "tls-cert", "", "PEM client certificate (mutual TLS: its CN is the account)")
	f.StringVar(&a.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&a.tlsServerName, "tls-server-name", "", "the name the server's certificate must have (default: the host of --server)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table, wide (more columns), json (the resource's protojson), yaml (the same as YAML), name (resource names), or jsonpath=TEMPLATE (e.g. '{.items[*].displayName}')")
	a.timeout.d = defaultTimeout
	f.Var(&a.timeout, "timeout", "how long each request may take (not --wait, which waits until the operation ends)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "wide", "json", "yaml", "name", "jsonpath="}, cobra.ShellCompDirectiveNoFileComp))

	root.AddGroup(&cobra.Group{ID: "clusters", Title: "Clusters:"}, &cobra.Group{ID: "catalog", Title: "Catalog:"}, &cobra.Group{ID: "operations", Title: "Operations:"})
	for _, c := range a.clusterCommands() {
		c.GroupID = "clusters"
		root.AddCommand(c)
	}
	for _, c := range a.catalogCommands() {
		c.GroupID = "catalog"
		root.AddCommand(c)
	}
	root.AddGroup(&cobra.Group{ID: "config", Title: "Configuration:"})
	cfg := a.configCommand()
	cfg.GroupID = "config"
	root.AddCommand(cfg)
	ops := a.operationsCommand()
	ops.GroupID = "operations"
	root.AddCommand(ops)
	root.AddGroup(&cobra.Group{ID: "quotas", Title: "Quotas:"})
	quota := a.quotaCommand()
	quota.GroupID = "quotas"
	root.AddCommand(quota)
	return root
}

// applyEnvironment sets every flag not given on the command line from its
// CLUSTERCTL_* twin (--tls-ca <- CLUSTERCTL_TLS_CA), then what is still
// unset from the context in use; sets[0] holds the global flags.
func (a *app) applyEnvironment(sets ...*pflag.FlagSet) error {
	var err error
	for _, set := range sets {
		set.VisitAll(func(f *pflag.Flag) {
			if err != nil || f.Changed || f.Name == "help" || f.Name == "version" {
				return
			}
			env := "CLUSTERCTL_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
			if v := a.getenv(env); v != "" {
				if serr := set.Set(f.Name, v); serr != nil {
					err = usageError{fmt.Errorf("%s=%q: %w", env, v, serr)}
				}
			}
		})
	}
	if err == nil && len(sets) > 0 {
		err = a.applyContext(sets[0])
	}
	if err == nil {
		if oerr := checkOutput(a.output); oerr != nil {
			err = usageError{oerr}
		}
	}
	return err
}

// usageError is a mistake on the command line (exit 2, with a hint).
type usageError struct{ error }

// Unwrap gives errors.Is the mistake itself.
func (u usageError) Unwrap() error { return u.error }

// args wraps a positional-argument check so that its error is a usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// noSubcommand refuses an argument where a subcommand was expected: an
// unknown command, with the commands it is a likely misspelling of (by edit
// distance, as cobra suggests them).
func noSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + orList(s) + "?"
	}
	return usageError{errors.New(msg)}
}

// report prints err for a person, on one line, and returns the exit code:
// 2 for a usage mistake, 1 when the server refused or the operation
// failed, 130 when Ctrl-C stopped a wait. describe says what went wrong.
func (a *app) report(ctx context.Context, cmd *cobra.Command, err error) int {
	var usage usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(a.stderr, "clusterctl: %s (see '%s --help')\n", oneLine(usage.Error()), cmd.CommandPath())
		return exitUsage
	}
	if strings.HasPrefix(err.Error(), "unknown command ") {
		// cobra's own refusal of a command it does not know.
		fmt.Fprintf(a.stderr, "clusterctl: %s (see '%s --help')\n", oneLine(err.Error()), cmd.CommandPath())
		return exitUsage
	}
	var stopped *stoppedWaiting
	if errors.As(err, &stopped) && ctx.Err() != nil {
		fmt.Fprintf(a.stderr, "clusterctl: stopped waiting; %s goes on (clusterctl operations wait %s)\n", stopped.name, stopped.name)
		return exitInterrupted
	}
	var declined declinedError
	if errors.As(err, &declined) {
		fmt.Fprintf(a.stderr, "clusterctl: %s\n", oneLine(err.Error()))
		return exitFailed
	}
	if client.Code(err) == codes.Unknown && client.ErrorInfo(err) == nil {
		fmt.Fprintf(a.stderr, "clusterctl: %s\n", oneLine(err.Error()))
		return exitFailed
	}
	fmt.Fprintf(a.stderr, "clusterctl: %s\n", a.describe(cmd, err))
	return exitFailed
}

// declinedError: the user answered no to a confirmation (exit 1).
type declinedError struct{ what string }

// Error says what was not done.
func (d declinedError) Error() string { return d.what }

// isTerminal reports whether w is a terminal, and its width.
func isTerminal(w io.Writer) (bool, int) {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false, 0
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil || width <= 0 {
		width = 80
	}
	return true, width
}
