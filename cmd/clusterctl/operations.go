package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// pollEvery is how often --wait redraws progress at most: one
// WaitOperation call returns at the operation's end or after this long.
const pollEvery = 250 * time.Millisecond

// stoppedWaiting: the wait ended before the operation did (Ctrl-C).
type stoppedWaiting struct {
	name string
	err  error
}

// Error names the operation that goes on.
func (s *stoppedWaiting) Error() string { return "wait for " + s.name + ": " + s.err.Error() }

// Unwrap gives the context's error (cancelled by Ctrl-C).
func (s *stoppedWaiting) Unwrap() error { return s.err }

// follow waits for op to end, drawing its progress on stderr, and prints
// the resulting cluster (or, for a delete, the done operation). A failed
// operation is returned as its *client.OperationError.
func (a *app) follow(ctx context.Context, c *client.Client, op *longrunningpb.Operation) error {
	done, err := a.waitDrawn(ctx, c, op)
	if err != nil {
		return err
	}
	cl, err := client.ClusterOf(done)
	if err != nil {
		return a.printOperations(done) // a delete's response is empty
	}
	// The response is the cluster as the operation left it; read it again
	// for its nodes (and anything that happened since).
	ctx, cancel := a.call(ctx)
	defer cancel()
	if now, err := c.Clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: cl.GetName()}); err == nil {
		cl = now
	}
	return a.printCluster(cl)
}

func (a *app) operationsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "operations",
		Aliases: []string{"operation", "ops", "op"},
		Short:   "List, show, wait for and cancel operations (google.longrunning.Operations)",
		Args:    noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("name a subcommand: list, get, wait or cancel")}
		},
	}
	cmd.AddCommand(a.operationsList(), a.operationsGet(), a.operationsWait(), a.operationsCancel())
	return cmd
}

func (a *app) operationsList() *cobra.Command {
	var filter, cluster string
	var running, failed bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list [--cluster CLUSTER] [--running | --failed] [--filter F] [--limit N]",
		Short: "List operations, newest first, with their age, duration and the reason of a failure",
		Example: "  clusterctl operations list --running\n  clusterctl operations list --cluster demo --failed\n" +
			"  clusterctl operations list --filter 'verb = scale AND done = true' --limit 5",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			var terms []string
			if filter != "" {
				terms = append(terms, "("+filter+")")
			}
			if cluster != "" {
				name, err := a.clusterName(cmd.Context(), cluster)
				if err != nil {
					return err
				}
				terms = append(terms, `cluster = "`+name+`"`)
			}
			if running {
				terms = append(terms, "done = false")
			}
			if failed {
				terms = append(terms, "done = true")
			}
			// Every page: the newest come last in the server's order.
			ops, err := listAll(cmd.Context(), a, 0, func(ctx context.Context, token string) ([]*longrunningpb.Operation, string, error) {
				resp, err := c.Operations.ListOperations(ctx, &longrunningpb.ListOperationsRequest{
					Name: "operations", Filter: joinAnd(terms), PageSize: 1000, PageToken: token})
				return resp.GetOperations(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if failed {
				ops = slices.DeleteFunc(ops, func(op *longrunningpb.Operation) bool { return operationStatus(op) != "failed" })
			}
			newestFirst(ops)
			if limit > 0 && len(ops) > limit {
				ops = ops[:limit]
			}
			var displayNames map[string]string
			if a.output == "table" || a.output == "wide" {
				displayNames = a.displayNames(cmd.Context(), c, ops)
			}
			return a.printOperationList(&longrunningpb.ListOperationsResponse{Operations: ops}, displayNames)
		},
	}
	f := cmd.Flags()
	f.StringVar(&filter, "filter", "", "an AIP-160 filter on cluster, done, verb, create_time, update_time")
	f.StringVar(&cluster, "cluster", "", "only this cluster's operations")
	f.BoolVar(&running, "running", false, "only operations not done yet")
	f.BoolVar(&failed, "failed", false, "only operations that failed (not those cancelled)")
	f.IntVar(&limit, "limit", 0, "at most this many operations, the newest (0: all)")
	cmd.MarkFlagsMutuallyExclusive("running", "failed")
	_ = cmd.RegisterFlagCompletionFunc("cluster", a.clusterArg)
	return cmd
}

// newestFirst orders operations by their creation, newest first (by name,
// whose UUIDv7 is time-ordered, where the times are equal).
func newestFirst(ops []*longrunningpb.Operation) {
	slices.SortStableFunc(ops, func(x, y *longrunningpb.Operation) int {
		tx, ty := verbOf(x).GetCreateTime().AsTime(), verbOf(y).GetCreateTime().AsTime()
		if c := ty.Compare(tx); c != 0 {
			return c
		}
		return strings.Compare(y.GetName(), x.GetName())
	})
}

// displayNames maps the resource names of the clusters the caller sees,
// destroyed ones included, to their display names; for tables only, so a
// failure to read them leaves the resource names in place.
func (a *app) displayNames(ctx context.Context, c *client.Client, ops []*longrunningpb.Operation) map[string]string {
	out := map[string]string{}
	missing := func() bool {
		for _, op := range ops {
			if _, ok := out[verbOf(op).GetCluster()]; !ok {
				return true
			}
		}
		return false
	}
	for _, filter := range []string{"", "state = DESTROYED"} {
		if !missing() {
			break
		}
		clusters, err := listAll(ctx, a, 0, func(ctx context.Context, token string) ([]*clv1.Cluster, string, error) {
			resp, err := c.Clusters.ListClusters(ctx, &clv1.ListClustersRequest{Filter: filter, PageSize: 1000, PageToken: token})
			return resp.GetClusters(), resp.GetNextPageToken(), err
		})
		if err != nil {
			return out
		}
		for _, cl := range clusters {
			out[cl.GetName()] = cl.GetDisplayName()
		}
	}
	return out
}

// joinAnd joins filter terms with AND.
func joinAnd(terms []string) string {
	out := ""
	for i, t := range terms {
		if i > 0 {
			out += " AND "
		}
		out += t
	}
	return out
}

func (a *app) operationsGet() *cobra.Command {
	return &cobra.Command{
		Use:   "get OPERATION",
		Short: "Show an operation: its verb, cluster, step and progress, and how it ended",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			op, err := c.Operations.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: operationName(argv[0])})
			if err != nil {
				return err
			}
			return a.printOperations(op)
		},
	}
}

func (a *app) operationsWait() *cobra.Command {
	return &cobra.Command{
		Use:   "wait OPERATION",
		Short: "Follow an operation to its end, showing its progress; exits non-zero if it failed",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			return a.follow(cmd.Context(), c, &longrunningpb.Operation{Name: operationName(argv[0])})
		},
	}
}

func (a *app) operationsCancel() *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "cancel OPERATION",
		Short: "Stop an operation, its step in flight included; --wait follows it to its end",
		Long: `Stop an operation: its step in flight, held or slow, ends at once, and the operation
ends CANCELLED with the cluster following the operation's failure transition.

With --wait, the command follows the operation to its end and prints it. It exits 0 when the
cancel took effect (the operation ended CANCELLED; its error is in -o json) or when the operation
succeeded before the cancel reached it, and 1 when it failed otherwise.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			name := operationName(argv[0])
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			if _, err := c.Operations.CancelOperation(ctx, &longrunningpb.CancelOperationRequest{Name: name}); err != nil {
				return err
			}
			if wait {
				return a.followCancel(cmd.Context(), c, name)
			}
			op, err := c.Operations.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
			if err != nil {
				return err
			}
			return a.printOperations(op)
		},
	}
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "follow the operation to its end")
	return cmd
}

// followCancel follows a cancelled operation to its end and prints it (the
// operation, not the cluster: what the command acted on). An end CANCELLED is
// this command's success, so it exits 0 with the error in the printed
// operation, as after an operation that succeeded before the cancel reached
// it; another failure is returned (exit 1).
func (a *app) followCancel(ctx context.Context, c *client.Client, name string) error {
	done, err := a.waitDrawn(ctx, c, &longrunningpb.Operation{Name: name})
	var opErr *client.OperationError
	if err != nil && !(errors.As(err, &opErr) && client.Code(err) == codes.Canceled) {
		return err
	}
	return a.printOperations(done)
}

// waitDrawn waits for op to end, drawing its progress on stderr, and
// returns it done; a failed operation is returned with its
// *client.OperationError, and a wait that Ctrl-C ended as *stoppedWaiting.
func (a *app) waitDrawn(ctx context.Context, c *client.Client, op *longrunningpb.Operation) (*longrunningpb.Operation, error) {
	p := newProgress(a.stderr, op.GetName(), a.now)
	done, err := waitOperation(ctx, c, op, p.update)
	var opErr *client.OperationError
	switch {
	case err == nil, errors.As(err, &opErr):
		p.finish(done)
		return done, err
	case ctx.Err() != nil:
		p.abandon()
		return nil, &stoppedWaiting{name: op.GetName(), err: err}
	default:
		p.abandon()
		return nil, err
	}
}

// verbOf reads an operation's verb for tables.
func verbOf(op *longrunningpb.Operation) *clv1.OperationMetadata {
	md, err := client.MetadataOf(op)
	if err != nil {
		return &clv1.OperationMetadata{}
	}
	return md
}
