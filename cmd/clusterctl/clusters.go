package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lifecycle"
)

// notFoundError is a NOT_FOUND with its ErrorInfo, like the server's, for
// what clusterctl itself could not find (a display name).
func notFoundError(msg string) error {
	st, err := status.New(codes.NotFound, msg).WithDetails(&errdetails.ErrorInfo{Reason: client.ReasonNotFound, Domain: client.Domain})
	if err != nil {
		return status.Error(codes.NotFound, msg)
	}
	return st.Err()
}

// mutation is what every command that starts an operation shares:
// idempotency, the etag condition, and --wait.
type mutation struct {
	requestID string
	etag      string
	wait      bool
	// event is the state machine's event of the request, for a start or
	// stop: a refusal because the cluster is already where it leads is
	// success (exit 0, saying so).
	event lifecycle.Event
}

func (m *mutation) flags(cmd *cobra.Command, etag bool) {
	cmd.Flags().StringVar(&m.requestID, "request-id", "", "a UUID that makes the request idempotent: sent again, it returns the first request's operation")
	if etag {
		cmd.Flags().StringVar(&m.etag, "etag", "", "only if the cluster's etag is still this one (from get)")
	}
	cmd.Flags().BoolVarP(&m.wait, "wait", "w", false, "follow the operation to its end, showing its progress")
}

// mutate sends one mutation, then prints its operation, or with --wait
// follows it and prints the resulting cluster.
func (a *app) mutate(cmd *cobra.Command, m *mutation, send func(ctx context.Context, c *client.Client) (*longrunningpb.Operation, error)) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	ctx, cancel := a.call(cmd.Context())
	op, err := send(ctx, c)
	cancel()
	if state, ok := alreadyThere(err, m.event); ok && m.event != lifecycle.EventUnspecified {
		return a.alreadyThere(cmd.Context(), c, client.ErrorInfo(err).GetMetadata()["cluster"], state)
	}
	if err != nil {
		return err
	}
	if !m.wait {
		return a.printOperations(op)
	}
	return a.follow(cmd.Context(), c, op)
}

// clusterArg completes a CLUSTER argument with the display names the
// server lists (quietly nothing when it cannot be reached).
func (a *app) clusterArg(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if err := a.applyEnvironment(cmd.Root().PersistentFlags()); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
	defer cancel()
	resp, err := c.Clusters.ListClusters(ctx, &clv1.ListClustersRequest{PageSize: 1000})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, cl := range resp.GetClusters() {
		out = append(out, cobra.CompletionWithDesc(cl.GetDisplayName(), cl.GetState().String()))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) clusterCommands() []*cobra.Command {
	return []*cobra.Command{
		a.createCommand(), a.getCommand(), a.listCommand(),
		a.simpleMutation("start", "Start a STOPPED or ALERT cluster (or retry the start of an ERROR one); a RUNNING one is left as it is", lifecycle.StartRequested,
			func(ctx context.Context, c *client.Client, name string, m *mutation) (*longrunningpb.Operation, error) {
				return c.Clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: name, RequestId: m.requestID, Etag: m.etag})
			}),
		a.simpleMutation("stop", "Stop a cluster's machines, keeping its resources; a STOPPED one is left as it is", lifecycle.StopRequested,
			func(ctx context.Context, c *client.Client, name string, m *mutation) (*longrunningpb.Operation, error) {
				return c.Clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: name, RequestId: m.requestID, Etag: m.etag})
			}),
		a.scaleCommand(), a.upgradeCommand(),
		a.nodesCommand("add-nodes", "Add free EXTERNAL machines to a cluster as workers",
			func(ctx context.Context, c *client.Client, name string, machines []string, m *mutation) (*longrunningpb.Operation, error) {
				return c.Clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: name, Machines: machines, RequestId: m.requestID})
			}),
		a.nodesCommand("remove-nodes", "Drain and remove named nodes from a cluster",
			func(ctx context.Context, c *client.Client, name string, nodes []string, m *mutation) (*longrunningpb.Operation, error) {
				return c.Clusters.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: name, Nodes: nodes, RequestId: m.requestID})
			}),
		a.deleteCommand(),
		a.eventsCommand(), a.kubeconfigCommand(),
	}
}

// kubeconfigCommand is `clusterctl kubeconfig CLUSTER [-f FILE]`: the
// cluster's admin kubeconfig on stdout (-o json: the whole Kubeconfig
// message), or written to FILE with mode 0600 (it holds a private key).
// The file flag is -f, not -o, which is every command's output format.
func (a *app) kubeconfigCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "kubeconfig CLUSTER [-f FILE]",
		Short: "Print (or write to a 0600 file) a cluster's admin kubeconfig; the read is recorded in its events",
		Example: "  clusterctl kubeconfig demo -f demo.kubeconfig && kubectl --kubeconfig demo.kubeconfig get nodes\n" +
			"  clusterctl kubeconfig demo > ~/.kube/demo   # mind the file's mode",
		Args:              args(cobra.ExactArgs(1)),
		ValidArgsFunction: a.clusterArg,
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			k, err := c.Clusters.GetKubeconfig(ctx, &clv1.GetKubeconfigRequest{Name: name})
			cancel()
			if err != nil {
				return err
			}
			if file != "" {
				if err := writePrivate(file, []byte(k.GetKubeconfig())); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "Wrote the kubeconfig of %s (context %s) to %s.\n", argv[0], k.GetContext(), file)
				return nil
			}
			return a.show(view{msg: k, names: []string{name}, table: func(bool) error {
				_, err := io.WriteString(a.stdout, k.GetKubeconfig())
				return err
			}})
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "write the kubeconfig to this file (mode 0600, replacing it) instead of stdout")
	return cmd
}

// writePrivate writes data to path readable by its owner only, whatever
// mode a file already there had: it is written to a new 0600 file beside
// it, then renamed over it.
func writePrivate(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	if err := tmp.Chmod(0o600); werr == nil {
		werr = err
	}
	if err := tmp.Close(); werr == nil {
		werr = err
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, werr)
	}
	return nil
}

func (a *app) createCommand() *cobra.Command {
	var m mutation
	spec := &clv1.Cluster{}
	var autoMin, autoMax int32
	cmd := &cobra.Command{
		Use:   "create NAME --kubernetes-version V --offering O [--workers N]",
		Short: "Create a cluster",
		Example: "  clusterctl create demo --kubernetes-version 1.30.2 --workers 2 --offering medium --wait\n" +
			"  clusterctl create demo --kubernetes-version 1.30.2 --offering medium -o json",
		Args:              args(cobra.ExactArgs(1)),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, argv []string) error {
			spec.DisplayName = argv[0]
			if autoMax > 0 {
				spec.Autoscaling = &clv1.Autoscaling{Enabled: true, MinSize: autoMin, MaxSize: autoMax}
			}
			return a.mutate(cmd, &m, func(ctx context.Context, c *client.Client) (*longrunningpb.Operation, error) {
				return c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec, RequestId: m.requestID})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.KubernetesVersion, "kubernetes-version", "", "the Kubernetes version, e.g. 1.30.2")
	f.StringVar(&spec.ServiceOffering, "offering", "", "the service offering (machine size) of the workers, and of the control nodes unless --control-offering, e.g. medium")
	f.StringVar(&spec.ControlOffering, "control-offering", "", "the service offering of the control nodes (default: --offering)")
	f.Int32Var(&spec.WorkerNodeCount, "workers", 1, "worker nodes")
	f.Int32Var(&spec.ControlNodeCount, "control-nodes", 0, "control-plane nodes (0: the server's default)")
	f.StringVar(&spec.Description, "description", "", "free text")
	f.Int32Var(&autoMin, "autoscale-min", 0, "with --autoscale-max: the fewest workers the autoscaler keeps")
	f.Int32Var(&autoMax, "autoscale-max", 0, "deploy the cluster autoscaler, adding workers up to this many")
	m.flags(cmd, false)
	_ = cmd.RegisterFlagCompletionFunc("kubernetes-version", func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return a.versionCompletions(cmd, "", true)
	})
	for _, flag := range []string{"offering", "control-offering"} {
		_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return a.offeringCompletions(cmd, true)
		})
	}
	return cmd
}

func (a *app) getCommand() *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:               "get CLUSTER [-w]",
		Short:             "Show a cluster and its nodes; -w then prints a line per change until Ctrl-C",
		Args:              args(cobra.ExactArgs(1)),
		ValidArgsFunction: a.clusterArg,
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			if watch {
				return a.watchClusters(cmd.Context(), watchOpener(c, "", name), true)
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			cl, err := c.Clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: name})
			if err != nil {
				return err
			}
			return a.printCluster(cl)
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "after the cluster, print a line per change (time, kind, state, step, event) until Ctrl-C")
	return cmd
}

func (a *app) listCommand() *cobra.Command {
	var filter string
	var limit int
	var watch bool
	cmd := &cobra.Command{
		Use:   "list [-w]",
		Short: "List clusters (every page, in creation order)",
		Example: "  clusterctl list\n  clusterctl list --filter 'state = RUNNING OR state = STOPPED'\n" +
			"  clusterctl list --filter 'state = DESTROYED' -o json",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			if watch {
				return a.watchClusters(cmd.Context(), watchOpener(c, filter, ""), false)
			}
			clusters, err := listAll(cmd.Context(), a, limit, func(ctx context.Context, token string) ([]*clv1.Cluster, string, error) {
				resp, err := c.Clusters.ListClusters(ctx, &clv1.ListClustersRequest{Filter: filter, PageSize: 1000, PageToken: token})
				return resp.GetClusters(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			return a.printClusters(&clv1.ListClustersResponse{Clusters: clusters})
		},
	}
	cmd.Flags().StringVar(&filter, "filter", "", "an AIP-160 filter on state, display_name, account, create_time, update_time")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many clusters (0: all)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "after the table, print a line per change of a listed cluster until Ctrl-C")
	cmd.MarkFlagsMutuallyExclusive("watch", "limit")
	return cmd
}

// alreadyThere reports a start or stop that had nothing to do: the cluster
// (name) is already in state. On stdout, like any result: a sentence in a
// table, the cluster in every other format.
func (a *app) alreadyThere(ctx context.Context, c *client.Client, name, state string) error {
	what := fmt.Sprintf("cluster %s is already %s; nothing to do", a.ownNames(name), state)
	if a.output == "table" {
		fmt.Fprintln(a.stdout, strings.ToUpper(what[:1])+what[1:]+".")
		return nil
	}
	fmt.Fprintf(a.stderr, "clusterctl: %s\n", what)
	ctx, cancel := a.call(ctx)
	defer cancel()
	cl, err := c.Clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: name})
	if err != nil {
		return err
	}
	return a.printCluster(cl)
}

// deleteCommand is delete: on a terminal it asks first (--yes does not);
// from a script (stdin not a terminal) it deletes without asking, as it
// always has.
func (a *app) deleteCommand() *cobra.Command {
	var yes bool
	cmd := a.simpleMutation("delete", "Destroy a cluster and its machines (asks first on a terminal; --yes does not)", lifecycle.EventUnspecified,
		func(ctx context.Context, c *client.Client, name string, m *mutation) (*longrunningpb.Operation, error) {
			return c.Clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: name, RequestId: m.requestID, Etag: m.etag})
		})
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		if !yes {
			if err := a.confirm(fmt.Sprintf("Delete cluster %s and all its machines? This cannot be undone. [y/N] ", argv[0])); err != nil {
				return fmt.Errorf("cluster %s not deleted: %w", argv[0], err)
			}
		}
		return run(cmd, argv)
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// confirm asks question on a terminal and returns a declinedError unless
// the answer is yes; when stdin is not a terminal it does not ask.
func (a *app) confirm(question string) error {
	f, ok := a.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	fmt.Fprint(a.stderr, question)
	answer, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && answer == "" {
		fmt.Fprintln(a.stderr)
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return declinedError{"not confirmed"}
}

// simpleMutation is a mutation of one cluster with no other parameter;
// event is its request's event when being already there is success.
func (a *app) simpleMutation(use, short string, event lifecycle.Event, send func(ctx context.Context, c *client.Client, name string, m *mutation) (*longrunningpb.Operation, error)) *cobra.Command {
	m := mutation{event: event}
	cmd := &cobra.Command{
		Use:               use + " CLUSTER",
		Short:             short,
		Args:              args(cobra.ExactArgs(1)),
		ValidArgsFunction: a.clusterArg,
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return a.mutate(cmd, &m, func(ctx context.Context, c *client.Client) (*longrunningpb.Operation, error) {
				return send(ctx, c, name, &m)
			})
		},
	}
	m.flags(cmd, true)
	return cmd
}

func (a *app) scaleCommand() *cobra.Command {
	var m mutation
	var workers, autoMin, autoMax int32
	var offering string
	var remove []string
	var noAutoscale bool
	cmd := &cobra.Command{
		Use:   "scale CLUSTER [--workers N] [--offering O] [--remove-node M]... [--autoscale-min A --autoscale-max B | --no-autoscale]",
		Short: "Change a cluster's size, offering or autoscaler",
		Example: "  clusterctl scale demo --workers 3 --wait\n" +
			"  clusterctl scale demo --workers 1 --remove-node machines/0192f0c1-7a3e-7000-8000-000000000001",
		Args:              args(cobra.ExactArgs(1)),
		ValidArgsFunction: a.clusterArg,
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			req := &clv1.ScaleClusterRequest{Name: name, ServiceOffering: offering, RemoveNodes: machineNames(remove), RequestId: m.requestID, Etag: m.etag}
			if cmd.Flags().Changed("workers") {
				req.WorkerNodeCount = &workers
			}
			switch {
			case noAutoscale:
				req.Autoscaling = &clv1.Autoscaling{Enabled: false}
			case autoMax > 0:
				req.Autoscaling = &clv1.Autoscaling{Enabled: true, MinSize: autoMin, MaxSize: autoMax}
			}
			return a.mutate(cmd, &m, func(ctx context.Context, c *client.Client) (*longrunningpb.Operation, error) {
				return c.Clusters.ScaleCluster(ctx, req)
			})
		},
	}
	f := cmd.Flags()
	f.Int32Var(&workers, "workers", 0, "the new number of worker nodes")
	f.StringVar(&offering, "offering", "", "the new service offering")
	f.StringArrayVar(&remove, "remove-node", nil, "a worker node to drain and remove when scaling down (repeatable)")
	f.Int32Var(&autoMin, "autoscale-min", 0, "with --autoscale-max: the fewest workers the autoscaler keeps")
	f.Int32Var(&autoMax, "autoscale-max", 0, "turn the autoscaler on, adding workers up to this many")
	f.BoolVar(&noAutoscale, "no-autoscale", false, "turn the autoscaler off")
	cmd.MarkFlagsMutuallyExclusive("autoscale-max", "no-autoscale")
	m.flags(cmd, true)
	_ = cmd.RegisterFlagCompletionFunc("offering", func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return a.offeringCompletions(cmd, true)
	})
	return cmd
}

func (a *app) upgradeCommand() *cobra.Command {
	var m mutation
	cmd := &cobra.Command{
		Use:     "upgrade CLUSTER VERSION",
		Short:   "Upgrade a running cluster's Kubernetes version (a later patch or the next minor)",
		Example: "  clusterctl upgrade demo 1.30.5 --wait\n  clusterctl versions --upgrades-for demo   # the versions it can upgrade to",
		Args:    args(cobra.ExactArgs(2)),
		// The cluster, then the versions it can upgrade to.
		ValidArgsFunction: func(cmd *cobra.Command, argv []string, s string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(argv) != 1 {
				return a.clusterArg(cmd, argv, s)
			}
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return a.versionCompletions(cmd, name, true)
		},
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return a.mutate(cmd, &m, func(ctx context.Context, c *client.Client) (*longrunningpb.Operation, error) {
				return c.Clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: name, KubernetesVersion: argv[1], RequestId: m.requestID, Etag: m.etag})
			})
		},
	}
	m.flags(cmd, true)
	return cmd
}

// nodesCommand is add-nodes or remove-nodes: a cluster and machines.
func (a *app) nodesCommand(use, short string, send func(ctx context.Context, c *client.Client, name string, machines []string, m *mutation) (*longrunningpb.Operation, error)) *cobra.Command {
	var m mutation
	cmd := &cobra.Command{
		Use:               use + " CLUSTER MACHINE...",
		Short:             short,
		Args:              args(cobra.MinimumNArgs(2)),
		ValidArgsFunction: a.clusterArg,
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return a.mutate(cmd, &m, func(ctx context.Context, c *client.Client) (*longrunningpb.Operation, error) {
				return send(ctx, c, name, machineNames(argv[1:]), &m)
			})
		},
	}
	m.flags(cmd, false)
	return cmd
}

func (a *app) eventsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:               "events CLUSTER [-f]",
		Short:             "Show a cluster's history: every transition and repair, oldest first; -f then follows new entries",
		Args:              args(cobra.ExactArgs(1)),
		ValidArgsFunction: a.clusterArg,
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, err := a.clusterName(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			if follow {
				return a.followEvents(cmd.Context(), c, name, watchOpener(c, "", name))
			}
			events, err := listAll(cmd.Context(), a, 0, func(ctx context.Context, token string) ([]*clv1.ClusterEvent, string, error) {
				resp, err := c.Clusters.ListClusterEvents(ctx, &clv1.ListClusterEventsRequest{Parent: name, PageSize: 1000, PageToken: token})
				return resp.GetEvents(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			return a.printEvents(&clv1.ListClusterEventsResponse{Events: events})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "after the history, print new entries as they are written until Ctrl-C")
	return cmd
}
