package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// clientConfig is clusterctl's configuration file: named contexts, each a
// server and how to reach it, and the one in use. It never holds a token,
// only the file one is read from.
type clientConfig struct {
	CurrentContext string          `yaml:"current-context,omitempty" json:"currentContext,omitempty"`
	Contexts       []clientContext `yaml:"contexts" json:"contexts"`
}

// clientContext is one server and how to reach it; every field is the
// default of a global flag (defaults says which).
type clientContext struct {
	Name          string `yaml:"name" json:"name"`
	Server        string `yaml:"server,omitempty" json:"server,omitempty"`
	Account       string `yaml:"account,omitempty" json:"account,omitempty"`
	TokenFile     string `yaml:"token-file,omitempty" json:"tokenFile,omitempty"`
	TLS           bool   `yaml:"tls,omitempty" json:"tls,omitempty"`
	CAFile        string `yaml:"ca-file,omitempty" json:"caFile,omitempty"`
	CertFile      string `yaml:"cert-file,omitempty" json:"certFile,omitempty"`
	KeyFile       string `yaml:"key-file,omitempty" json:"keyFile,omitempty"`
	TLSServerName string `yaml:"tls-server-name,omitempty" json:"tlsServerName,omitempty"`
}

// defaults are the flag values ctx sets, by flag name.
func (c clientContext) defaults() map[string]string {
	out := map[string]string{}
	set := func(flag, v string) {
		if v != "" {
			out[flag] = v
		}
	}
	set("server", c.Server)
	set("account", c.Account)
	set("token-file", c.TokenFile)
	if c.TLS {
		out["tls"] = "true"
	}
	set("tls-ca", c.CAFile)
	set("tls-cert", c.CertFile)
	set("tls-key", c.KeyFile)
	set("tls-server-name", c.TLSServerName)
	return out
}

// configPath is the configuration file: --config (CLUSTERCTL_CONFIG), else
// $XDG_CONFIG_HOME/clusterctl/config, else ~/.config/clusterctl/config.
func (a *app) configPath() (string, error) {
	if a.configFile != "" {
		return a.configFile, nil
	}
	if v := a.getenv("CLUSTERCTL_CONFIG"); v != "" {
		return v, nil
	}
	if x := a.getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "clusterctl", "config"), nil
	}
	home := a.getenv("HOME")
	if home == "" {
		return "", errors.New("no configuration file: set CLUSTERCTL_CONFIG, XDG_CONFIG_HOME or HOME")
	}
	return filepath.Join(home, ".config", "clusterctl", "config"), nil
}

// loadConfig reads the configuration file; a missing one is empty.
func (a *app) loadConfig() (*clientConfig, string, error) {
	path, err := a.configPath()
	if err != nil {
		return nil, "", err
	}
	cfg := &clientConfig{}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, path, nil
	}
	if err != nil {
		return nil, path, fmt.Errorf("read %s: %w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && len(bytes.TrimSpace(data)) > 0 {
		return nil, path, fmt.Errorf("read %s: %w", path, err)
	}
	return cfg, path, nil
}

// saveConfig writes the configuration file, readable by its owner only.
func saveConfig(path string, cfg *clientConfig) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return writePrivate(path, data)
}

func (cfg *clientConfig) find(name string) int {
	for i, c := range cfg.Contexts {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// applyContext sets every flag still unset (neither on the command line
// nor by its CLUSTERCTL_* twin) from the context in use: --context
// (CLUSTERCTL_CONTEXT), else the file's current context.
func (a *app) applyContext(set *pflag.FlagSet) error {
	if _, err := a.configPath(); err != nil && a.contextName == "" {
		return nil // no file to read (no HOME), and no context asked for
	}
	cfg, path, err := a.loadConfig()
	if err != nil {
		return usageError{err}
	}
	name := a.contextName
	if name == "" {
		name = cfg.CurrentContext
	}
	if name == "" {
		return nil
	}
	i := cfg.find(name)
	if i < 0 {
		return usageError{fmt.Errorf("no context %q in %s (clusterctl config get-contexts)", name, path)}
	}
	tokenGiven := set.Changed("token")
	for flag, v := range cfg.Contexts[i].defaults() {
		if set.Changed(flag) || (flag == "token-file" && tokenGiven) {
			continue
		}
		if err := set.Set(flag, v); err != nil {
			return usageError{fmt.Errorf("context %q in %s: %s %q: %w", name, path, flag, v, err)}
		}
	}
	return nil
}

// configCommand is `clusterctl config`: contexts, kubectl's way.
func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Name servers and how to reach them (contexts), and choose the one in use",
		Long: "A context is a server and how to reach it: its address, a token file, TLS and the account.\n" +
			"The file is $CLUSTERCTL_CONFIG (or --config), else $XDG_CONFIG_HOME/clusterctl/config, else\n" +
			"~/.config/clusterctl/config, written with mode 0600. A flag wins over its CLUSTERCTL_* twin,\n" +
			"which wins over the context in use (--context, CLUSTERCTL_CONTEXT, or current-context).",
		Example: "  clusterctl config set-context prod --server https://clusterd.example.com --token-file ~/.clusterd-token --ca-file ca.pem\n" +
			"  clusterctl config use-context prod\n  clusterctl config get-contexts",
		Args: noSubcommand,
		RunE: func(*cobra.Command, []string) error {
			return usageError{errors.New("name a subcommand: set-context, use-context, get-contexts, current-context or delete-context")}
		},
		// The config commands read the flags as given: no environment
		// twin and no context fills them in.
		PersistentPreRunE: func(*cobra.Command, []string) error { return checkOutputUsage(a.output) },
	}
	cmd.AddCommand(a.setContextCommand(), a.useContextCommand(), a.getContextsCommand(), a.currentContextCommand(), a.deleteContextCommand())
	return cmd
}

func checkOutputUsage(o string) error {
	if err := checkOutput(o); err != nil {
		return usageError{err}
	}
	return nil
}

func (a *app) setContextCommand() *cobra.Command {
	var caFile, certFile, keyFile string
	cmd := &cobra.Command{
		Use:   "set-context NAME [--server S] [--token-file F] [--tls] [--ca-file F] [--cert-file F --key-file F] [--account A] [--tls-server-name N]",
		Short: "Add a context, or change the fields of one that its flags name",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			flags := cmd.Flags()
			if flags.Changed("token") {
				return usageError{errors.New("a context keeps a --token-file, never the token itself")}
			}
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			i := cfg.find(argv[0])
			if i < 0 {
				cfg.Contexts = append(cfg.Contexts, clientContext{Name: argv[0]})
				i = len(cfg.Contexts) - 1
			}
			c := &cfg.Contexts[i]
			changed := false
			str := func(dst *string, flag, v string, file bool) error {
				if !flags.Changed(flag) {
					return nil
				}
				if file && v != "" {
					abs, err := filepath.Abs(v)
					if err != nil {
						return fmt.Errorf("--%s: %w", flag, err)
					}
					v = abs
				}
				*dst, changed = v, true
				return nil
			}
			if flags.Changed("server") {
				if _, _, err := serverAddress(a.server); err != nil {
					return usageError{err}
				}
			}
			for _, f := range []struct {
				dst     *string
				flag, v string
				file    bool
			}{
				{&c.Server, "server", a.server, false}, {&c.Account, "account", a.account, false},
				{&c.TokenFile, "token-file", a.tokenFile, true}, {&c.TLSServerName, "tls-server-name", a.tlsServerName, false},
				{&c.CAFile, "ca-file", caFile, true}, {&c.CertFile, "cert-file", certFile, true}, {&c.KeyFile, "key-file", keyFile, true},
				{&c.CAFile, "tls-ca", a.tlsCA, true}, {&c.CertFile, "tls-cert", a.tlsCert, true}, {&c.KeyFile, "tls-key", a.tlsKey, true},
			} {
				if err := str(f.dst, f.flag, f.v, f.file); err != nil {
					return usageError{err}
				}
			}
			if flags.Changed("tls") {
				c.TLS, changed = a.useTLS, true
			}
			if (c.CertFile == "") != (c.KeyFile == "") {
				return usageError{errors.New("--cert-file and --key-file go together")}
			}
			if cfg.CurrentContext == "" {
				cfg.CurrentContext = c.Name
			}
			if err := saveConfig(path, cfg); err != nil {
				return err
			}
			what := "Context %q set"
			if !changed {
				what = "Context %q unchanged"
			}
			fmt.Fprintf(a.stdout, what+" in %s.\n", c.Name, path)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&caFile, "ca-file", "", "PEM CA bundle to verify the server with (the context's --tls-ca)")
	f.StringVar(&certFile, "cert-file", "", "PEM client certificate (the context's --tls-cert)")
	f.StringVar(&keyFile, "key-file", "", "PEM private key of --cert-file (the context's --tls-key)")
	return cmd
}

func (a *app) useContextCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "use-context NAME",
		Short: "Make a context the one in use",
		Args:  args(cobra.ExactArgs(1)),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return a.contextNames(), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(_ *cobra.Command, argv []string) error {
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			if cfg.find(argv[0]) < 0 {
				return usageError{fmt.Errorf("no context %q in %s (clusterctl config get-contexts)", argv[0], path)}
			}
			cfg.CurrentContext = argv[0]
			if err := saveConfig(path, cfg); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "Switched to context %q.\n", argv[0])
			return nil
		},
	}
}

func (a *app) contextNames() []cobra.Completion {
	cfg, _, err := a.loadConfig()
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, c := range cfg.Contexts {
		out = append(out, cobra.CompletionWithDesc(c.Name, c.Server))
	}
	return out
}

func (a *app) getContextsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts; * marks the one in use",
		Args:  args(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			cfg, _, err := a.loadConfig()
			if err != nil {
				return err
			}
			switch a.output {
			case "name":
				for _, c := range cfg.Contexts {
					fmt.Fprintln(a.stdout, c.Name)
				}
				return nil
			case "yaml":
				out, err := yaml.Marshal(cfg)
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(out)
				return err
			case "json":
				out, err := json.MarshalIndent(cfg, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stdout, "%s\n", out)
				return err
			case "table", "wide":
			default:
				return usageError{fmt.Errorf("get-contexts prints a table, wide, json, yaml or name, not %s", a.output)}
			}
			w := a.table()
			fmt.Fprintln(w, "CURRENT\tNAME\tSERVER\tTLS\tACCOUNT\tTOKEN FILE")
			for _, c := range cfg.Contexts {
				mark := ""
				if c.Name == cfg.CurrentContext {
					mark = "*"
				}
				secure := c.TLS || c.CAFile != "" || c.CertFile != "" || c.TLSServerName != ""
				if _, scheme, _ := serverAddress(c.Server); scheme == "https" || scheme == "grpcs" {
					secure = true
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", mark, c.Name, dash(c.Server), strconv.FormatBool(secure), dash(c.Account), dash(c.TokenFile))
			}
			return w.Flush()
		},
	}
}

func (a *app) currentContextCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "current-context",
		Short: "Print the name of the context in use",
		Args:  args(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			if cfg.CurrentContext == "" {
				return fmt.Errorf("no current context in %s (clusterctl config use-context NAME)", path)
			}
			fmt.Fprintln(a.stdout, cfg.CurrentContext)
			return nil
		},
	}
}

func (a *app) deleteContextCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete-context NAME",
		Short: "Remove a context (the current one too: then none is in use)",
		Args:  args(cobra.ExactArgs(1)),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return a.contextNames(), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(_ *cobra.Command, argv []string) error {
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			i := cfg.find(argv[0])
			if i < 0 {
				return usageError{fmt.Errorf("no context %q in %s", argv[0], path)}
			}
			cfg.Contexts = append(cfg.Contexts[:i], cfg.Contexts[i+1:]...)
			if cfg.CurrentContext == argv[0] {
				cfg.CurrentContext = ""
			}
			if err := saveConfig(path, cfg); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "Deleted context %q from %s.\n", argv[0], path)
			return nil
		},
	}
}
