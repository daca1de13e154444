package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// quotaName is the quota of an account; "-" is the caller's own.
func quotaName(account string) string { return "accounts/" + account + "/quota" }

func (a *app) quotaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota [ACCOUNT]",
		Short: "Show an account's quota: its limits and what its clusters hold (default: your account)",
		Example: "  clusterctl quota\n  clusterctl quota team-a\n" +
			"  clusterctl quota set team-a --clusters 10 --nodes 100 --cpus 400 --memory-mb 819200",
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			account := "-"
			if len(argv) == 1 {
				account = argv[0]
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			q, err := c.Quotas.GetQuota(ctx, &clv1.GetQuotaRequest{Name: quotaName(account)})
			if err != nil {
				return err
			}
			return a.printQuota(q)
		},
	}
	cmd.AddCommand(a.quotaSetCommand())
	return cmd
}

// quotaSetCommand sets the limits named by flags; "unlimited" lifts one.
func (a *app) quotaSetCommand() *cobra.Command {
	limits := []struct{ flag, path string }{
		{"clusters", "limits.clusters"}, {"nodes", "limits.nodes"}, {"cpus", "limits.cpus"}, {"memory-mb", "limits.memory_mb"},
	}
	values := make([]string, len(limits))
	cmd := &cobra.Command{
		Use:   "set ACCOUNT [--clusters N] [--nodes N] [--cpus N] [--memory-mb N]",
		Short: "Set an account's limits (admins only); the limits not named keep their values",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			q := &clv1.Quota{Name: quotaName(argv[0]), Limits: &clv1.QuotaLimits{}}
			mask := &fieldmaskpb.FieldMask{}
			dst := []**int64{&q.Limits.Clusters, &q.Limits.Nodes, &q.Limits.Cpus, &q.Limits.MemoryMb}
			for i, l := range limits {
				if !cmd.Flags().Changed(l.flag) {
					continue
				}
				mask.Paths = append(mask.Paths, l.path)
				if values[i] == "unlimited" {
					continue
				}
				n, err := strconv.ParseInt(values[i], 10, 64)
				if err != nil || n < 0 {
					return usageError{fmt.Errorf("--%s %q: want a non-negative integer or unlimited", l.flag, values[i])}
				}
				*dst[i] = &n
			}
			if len(mask.Paths) == 0 {
				return usageError{fmt.Errorf("name at least one of --clusters, --nodes, --cpus, --memory-mb")}
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			got, err := c.Quotas.UpdateQuota(ctx, &clv1.UpdateQuotaRequest{Quota: q, UpdateMask: mask})
			if err != nil {
				return err
			}
			return a.printQuota(got)
		},
	}
	for i, l := range limits {
		cmd.Flags().StringVar(&values[i], l.flag, "", "the limit of "+l.flag+" (a number, or unlimited)")
	}
	return cmd
}

func (a *app) printQuota(q *clv1.Quota) error {
	return a.show(view{msg: q, names: []string{q.GetName()}, table: func(bool) error { return a.quotaTable(q) }})
}

func (a *app) quotaTable(q *clv1.Quota) error {
	limit := func(n *int64) string {
		if n == nil {
			return "unlimited"
		}
		return strconv.FormatInt(*n, 10)
	}
	source := "the server's default"
	if q.GetExplicit() {
		source = "set by an admin, " + a.stampAge(q.GetUpdateTime())
	}
	fmt.Fprintf(a.stdout, "%s (limits: %s)\n", q.GetName(), source)
	w := a.table()
	fmt.Fprintln(w, "RESOURCE\tUSED\tLIMIT")
	l, u := q.GetLimits(), q.GetUsage()
	fmt.Fprintf(w, "clusters\t%d\t%s\n", u.GetClusters(), limit(l.Clusters))
	fmt.Fprintf(w, "nodes\t%d\t%s\n", u.GetNodes(), limit(l.Nodes))
	fmt.Fprintf(w, "cpus\t%d\t%s\n", u.GetCpus(), limit(l.Cpus))
	fmt.Fprintf(w, "memory_mb\t%d\t%s\n", u.GetMemoryMb(), limit(l.MemoryMb))
	return w.Flush()
}
