package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// The catalog commands: versions and offerings list what clusters may be
// made of (every caller); their create, update and delete subcommands are
// an admin's (the server refuses others with PERMISSION_DENIED).

// catalogState reads --state.
func catalogState(s string) (clv1.CatalogState, error) {
	switch strings.ToUpper(s) {
	case "ENABLED":
		return clv1.CatalogState_ENABLED, nil
	case "DISABLED":
		return clv1.CatalogState_DISABLED, nil
	}
	return 0, usageError{fmt.Errorf("--state %q: want ENABLED or DISABLED", s)}
}

// completeWith lists completions from the server, quietly nothing when it
// cannot be reached.
func (a *app) completeWith(cmd *cobra.Command, list func(ctx context.Context, c *client.Client) ([]cobra.Completion, error)) ([]cobra.Completion, cobra.ShellCompDirective) {
	if err := a.applyEnvironment(cmd.Root().PersistentFlags()); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
	defer cancel()
	out, err := list(ctx, c)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// versionCompletions are the server's ENABLED Kubernetes versions, or, with
// cluster set, the versions that cluster can upgrade to.
func (a *app) versionCompletions(cmd *cobra.Command, cluster string, enabledOnly bool) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.completeWith(cmd, func(ctx context.Context, c *client.Client) ([]cobra.Completion, error) {
		resp, err := c.Catalog.ListKubernetesVersions(ctx, &clv1.ListKubernetesVersionsRequest{PageSize: 1000, UpgradesFor: cluster})
		if err != nil {
			return nil, err
		}
		var out []cobra.Completion
		for _, v := range resp.GetKubernetesVersions() {
			if enabledOnly && v.GetState() != clv1.CatalogState_ENABLED {
				continue
			}
			out = append(out, cobra.CompletionWithDesc(v.GetVersion(), v.GetState().String()))
		}
		return out, nil
	})
}

// offeringCompletions are the server's service offerings (ENABLED ones
// only when enabledOnly), described by their size.
func (a *app) offeringCompletions(cmd *cobra.Command, enabledOnly bool) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.completeWith(cmd, func(ctx context.Context, c *client.Client) ([]cobra.Completion, error) {
		resp, err := c.Catalog.ListServiceOfferings(ctx, &clv1.ListServiceOfferingsRequest{PageSize: 1000})
		if err != nil {
			return nil, err
		}
		var out []cobra.Completion
		for _, o := range resp.GetServiceOfferings() {
			if enabledOnly && o.GetState() != clv1.CatalogState_ENABLED {
				continue
			}
			out = append(out, cobra.CompletionWithDesc(strings.TrimPrefix(o.GetName(), "serviceOfferings/"),
				fmt.Sprintf("%d vCPU, %d MB, %s", o.GetCpus(), o.GetMemoryMb(), o.GetState())))
		}
		return out, nil
	})
}

// firstArg completes only the first positional argument with complete.
func firstArg(complete func(cmd *cobra.Command) ([]cobra.Completion, cobra.ShellCompDirective)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return complete(cmd)
	}
}

func (a *app) catalogCommands() []*cobra.Command {
	return []*cobra.Command{a.versionsCommand(), a.offeringsCommand()}
}

func (a *app) versionsCommand() *cobra.Command {
	var upgradesFor string
	cmd := &cobra.Command{
		Use:   "versions",
		Short: "List the Kubernetes versions clusters may run (or a cluster's upgrade targets)",
		Example: "  clusterctl versions\n  clusterctl versions --upgrades-for demo\n" +
			"  clusterctl versions create 1.32.0 --min-cpus 2 --min-memory-mb 4096   # admins\n" +
			"  clusterctl versions update 1.28.9 --state DISABLED                    # admins",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			cluster := ""
			if upgradesFor != "" {
				if cluster, err = a.clusterName(cmd.Context(), upgradesFor); err != nil {
					return err
				}
			}
			vs, err := listAll(cmd.Context(), a, 0, func(ctx context.Context, token string) ([]*clv1.KubernetesVersion, string, error) {
				resp, err := c.Catalog.ListKubernetesVersions(ctx, &clv1.ListKubernetesVersionsRequest{PageSize: 1000, PageToken: token, UpgradesFor: cluster})
				return resp.GetKubernetesVersions(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			return a.printVersions(&clv1.ListKubernetesVersionsResponse{KubernetesVersions: vs})
		},
	}
	cmd.Flags().StringVar(&upgradesFor, "upgrades-for", "", "list only the ENABLED versions this CLUSTER can upgrade to")
	_ = cmd.RegisterFlagCompletionFunc("upgrades-for", func(cmd *cobra.Command, _ []string, s string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return a.clusterArg(cmd, nil, s)
	})
	versionArg := firstArg(func(cmd *cobra.Command) ([]cobra.Completion, cobra.ShellCompDirective) {
		return a.versionCompletions(cmd, "", false)
	})
	cmd.AddCommand(a.versionGetCommand(versionArg), a.versionCreateCommand(), a.versionUpdateCommand(versionArg), a.versionDeleteCommand(versionArg))
	return cmd
}

func (a *app) versionGetCommand(complete cobra.CompletionFunc) *cobra.Command {
	return &cobra.Command{
		Use: "get VERSION", Short: "Show a Kubernetes version", Args: args(cobra.ExactArgs(1)), ValidArgsFunction: complete,
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.versionCall(cmd, func(ctx context.Context, c *client.Client) (*clv1.KubernetesVersion, error) {
				return c.Catalog.GetKubernetesVersion(ctx, &clv1.GetKubernetesVersionRequest{Name: "kubernetesVersions/" + argv[0]})
			})
		},
	}
}

func (a *app) versionCreateCommand() *cobra.Command {
	v := &clv1.KubernetesVersion{}
	var disabled bool
	cmd := &cobra.Command{
		Use: "create VERSION [--min-cpus N] [--min-memory-mb M] [--iso NAME] [--disabled]", Short: "Add a Kubernetes version (admins)",
		Args: args(cobra.ExactArgs(1)), ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, argv []string) error {
			if disabled {
				v.State = clv1.CatalogState_DISABLED
			}
			return a.versionCall(cmd, func(ctx context.Context, c *client.Client) (*clv1.KubernetesVersion, error) {
				return c.Catalog.CreateKubernetesVersion(ctx, &clv1.CreateKubernetesVersionRequest{KubernetesVersionId: argv[0], KubernetesVersion: v})
			})
		},
	}
	f := cmd.Flags()
	f.Int32Var(&v.MinCpus, "min-cpus", 2, "the fewest vCPUs of a node that runs it")
	f.Int32Var(&v.MinMemoryMb, "min-memory-mb", 2048, "the least memory (MB) of a node that runs it")
	f.StringVar(&v.BinariesIso, "iso", "", "the ISO that installs it (default kubernetes-VERSION.iso)")
	f.BoolVar(&disabled, "disabled", false, "add it DISABLED (no new cluster or upgrade may use it yet)")
	return cmd
}

func (a *app) versionUpdateCommand(complete cobra.CompletionFunc) *cobra.Command {
	v := &clv1.KubernetesVersion{}
	var state string
	cmd := &cobra.Command{
		Use: "update VERSION [--state ENABLED|DISABLED] [--min-cpus N] [--min-memory-mb M] [--iso NAME]", Short: "Change a Kubernetes version (admins)",
		Args: args(cobra.ExactArgs(1)), ValidArgsFunction: complete,
		RunE: func(cmd *cobra.Command, argv []string) error {
			v.Name = "kubernetesVersions/" + argv[0]
			mask := &fieldmaskpb.FieldMask{}
			for flag, field := range map[string]string{"state": "state", "min-cpus": "min_cpus", "min-memory-mb": "min_memory_mb", "iso": "binaries_iso"} {
				if cmd.Flags().Changed(flag) {
					mask.Paths = append(mask.Paths, field)
				}
			}
			if len(mask.Paths) == 0 {
				return usageError{fmt.Errorf("nothing to change: give --state, --min-cpus, --min-memory-mb or --iso")}
			}
			if cmd.Flags().Changed("state") {
				st, err := catalogState(state)
				if err != nil {
					return err
				}
				v.State = st
			}
			return a.versionCall(cmd, func(ctx context.Context, c *client.Client) (*clv1.KubernetesVersion, error) {
				return c.Catalog.UpdateKubernetesVersion(ctx, &clv1.UpdateKubernetesVersionRequest{KubernetesVersion: v, UpdateMask: mask})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&state, "state", "", "ENABLED or DISABLED")
	f.Int32Var(&v.MinCpus, "min-cpus", 0, "the fewest vCPUs of a node that runs it")
	f.Int32Var(&v.MinMemoryMb, "min-memory-mb", 0, "the least memory (MB) of a node that runs it")
	f.StringVar(&v.BinariesIso, "iso", "", "the ISO that installs it")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{"ENABLED", "DISABLED"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (a *app) versionDeleteCommand(complete cobra.CompletionFunc) *cobra.Command {
	return &cobra.Command{
		Use: "delete VERSION", Short: "Delete a Kubernetes version no cluster uses (admins)",
		Args: args(cobra.ExactArgs(1)), ValidArgsFunction: complete,
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.deleteCall(cmd, "kubernetesVersions/"+argv[0], func(ctx context.Context, c *client.Client) error {
				_, err := c.Catalog.DeleteKubernetesVersion(ctx, &clv1.DeleteKubernetesVersionRequest{Name: "kubernetesVersions/" + argv[0]})
				return err
			})
		},
	}
}

func (a *app) offeringsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "offerings",
		Short: "List the service offerings (machine sizes) nodes may have",
		Example: "  clusterctl offerings\n" +
			"  clusterctl offerings create huge --cpus 16 --memory-mb 65536   # admins\n" +
			"  clusterctl offerings update small --state DISABLED             # admins",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			os, err := listAll(cmd.Context(), a, 0, func(ctx context.Context, token string) ([]*clv1.ServiceOffering, string, error) {
				resp, err := c.Catalog.ListServiceOfferings(ctx, &clv1.ListServiceOfferingsRequest{PageSize: 1000, PageToken: token})
				return resp.GetServiceOfferings(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			return a.printOfferings(&clv1.ListServiceOfferingsResponse{ServiceOfferings: os})
		},
	}
	offeringArg := firstArg(func(cmd *cobra.Command) ([]cobra.Completion, cobra.ShellCompDirective) {
		return a.offeringCompletions(cmd, false)
	})
	cmd.AddCommand(a.offeringGetCommand(offeringArg), a.offeringCreateCommand(), a.offeringUpdateCommand(offeringArg), a.offeringDeleteCommand(offeringArg))
	return cmd
}

func (a *app) offeringGetCommand(complete cobra.CompletionFunc) *cobra.Command {
	return &cobra.Command{
		Use: "get NAME", Short: "Show a service offering", Args: args(cobra.ExactArgs(1)), ValidArgsFunction: complete,
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.offeringCall(cmd, func(ctx context.Context, c *client.Client) (*clv1.ServiceOffering, error) {
				return c.Catalog.GetServiceOffering(ctx, &clv1.GetServiceOfferingRequest{Name: "serviceOfferings/" + argv[0]})
			})
		},
	}
}

func (a *app) offeringCreateCommand() *cobra.Command {
	o := &clv1.ServiceOffering{}
	var disabled bool
	cmd := &cobra.Command{
		Use: "create NAME --cpus N --memory-mb M [--description TEXT] [--disabled]", Short: "Add a service offering (admins; its size never changes)",
		Args: args(cobra.ExactArgs(1)), ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, argv []string) error {
			if disabled {
				o.State = clv1.CatalogState_DISABLED
			}
			return a.offeringCall(cmd, func(ctx context.Context, c *client.Client) (*clv1.ServiceOffering, error) {
				return c.Catalog.CreateServiceOffering(ctx, &clv1.CreateServiceOfferingRequest{ServiceOfferingId: argv[0], ServiceOffering: o})
			})
		},
	}
	f := cmd.Flags()
	f.Int32Var(&o.Cpus, "cpus", 0, "vCPUs per node")
	f.Int32Var(&o.MemoryMb, "memory-mb", 0, "memory per node, in MB")
	f.StringVar(&o.Description, "description", "", "free text")
	f.BoolVar(&disabled, "disabled", false, "add it DISABLED (no new cluster or scale may use it yet)")
	_ = cmd.MarkFlagRequired("cpus")
	_ = cmd.MarkFlagRequired("memory-mb")
	return cmd
}

func (a *app) offeringUpdateCommand(complete cobra.CompletionFunc) *cobra.Command {
	o := &clv1.ServiceOffering{}
	var state string
	cmd := &cobra.Command{
		Use: "update NAME [--state ENABLED|DISABLED] [--description TEXT]", Short: "Change a service offering's state or description (admins)",
		Args: args(cobra.ExactArgs(1)), ValidArgsFunction: complete,
		RunE: func(cmd *cobra.Command, argv []string) error {
			o.Name = "serviceOfferings/" + argv[0]
			mask := &fieldmaskpb.FieldMask{}
			if cmd.Flags().Changed("state") {
				st, err := catalogState(state)
				if err != nil {
					return err
				}
				o.State = st
				mask.Paths = append(mask.Paths, "state")
			}
			if cmd.Flags().Changed("description") {
				mask.Paths = append(mask.Paths, "description")
			}
			if len(mask.Paths) == 0 {
				return usageError{fmt.Errorf("nothing to change: give --state or --description (an offering's size never changes)")}
			}
			return a.offeringCall(cmd, func(ctx context.Context, c *client.Client) (*clv1.ServiceOffering, error) {
				return c.Catalog.UpdateServiceOffering(ctx, &clv1.UpdateServiceOfferingRequest{ServiceOffering: o, UpdateMask: mask})
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "ENABLED or DISABLED")
	cmd.Flags().StringVar(&o.Description, "description", "", "free text")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{"ENABLED", "DISABLED"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (a *app) offeringDeleteCommand(complete cobra.CompletionFunc) *cobra.Command {
	return &cobra.Command{
		Use: "delete NAME", Short: "Delete a service offering no cluster uses (admins)",
		Args: args(cobra.ExactArgs(1)), ValidArgsFunction: complete,
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.deleteCall(cmd, "serviceOfferings/"+argv[0], func(ctx context.Context, c *client.Client) error {
				_, err := c.Catalog.DeleteServiceOffering(ctx, &clv1.DeleteServiceOfferingRequest{Name: "serviceOfferings/" + argv[0]})
				return err
			})
		},
	}
}

func (a *app) versionCall(cmd *cobra.Command, send func(ctx context.Context, c *client.Client) (*clv1.KubernetesVersion, error)) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	ctx, cancel := a.call(cmd.Context())
	defer cancel()
	v, err := send(ctx, c)
	if err != nil {
		return err
	}
	return a.printVersions(&clv1.ListKubernetesVersionsResponse{KubernetesVersions: []*clv1.KubernetesVersion{v}}, v)
}

func (a *app) offeringCall(cmd *cobra.Command, send func(ctx context.Context, c *client.Client) (*clv1.ServiceOffering, error)) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	ctx, cancel := a.call(cmd.Context())
	defer cancel()
	o, err := send(ctx, c)
	if err != nil {
		return err
	}
	return a.printOfferings(&clv1.ListServiceOfferingsResponse{ServiceOfferings: []*clv1.ServiceOffering{o}}, o)
}

func (a *app) deleteCall(cmd *cobra.Command, name string, send func(ctx context.Context, c *client.Client) error) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	ctx, cancel := a.call(cmd.Context())
	defer cancel()
	if err := send(ctx, c); err != nil {
		return err
	}
	return a.show(view{msg: &emptypb.Empty{}, names: []string{name}, table: func(bool) error {
		_, err := fmt.Fprintf(a.stdout, "Deleted %s.\n", name)
		return err
	}})
}
