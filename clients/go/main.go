// Command go is the Go example client of clusterd, built on package client.
// Like the Java, TypeScript and Python examples beside it, it creates a
// cluster, follows its operation to the end printing each step, provokes and
// decodes an ABORTED refusal (another operation holds the cluster: a
// simulator HOLD keeps the create running) and an INVALID_ARGUMENT, and
// prints "client go: ok". `make clients` runs it against a fresh bin/clusterd:
//
//	go run ./clients/go -addr 127.0.0.1:9090
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"

	"github.com/clusterd/clusterd/client"
	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

func main() {
	addr := flag.String("addr", envOr("CLUSTERD_ADDR", "127.0.0.1:9090"), "clusterd gRPC address")
	token := flag.String("token", os.Getenv("CLUSTERD_TOKEN"), "bearer token, for a server with --auth-tokens")
	account := flag.String("account", os.Getenv("CLUSTERD_ACCOUNT"), "account, for a server in development mode")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, *addr, *token, *account); err != nil {
		fmt.Fprintln(os.Stderr, "client go: FAILED:", err)
		os.Exit(1)
	}
	fmt.Println("client go: ok")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, addr, token, account string) error {
	var opts []client.Option
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	if account != "" {
		opts = append(opts, client.WithAccount(account))
	}
	c, err := client.New(addr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()

	// Hold the create at join_node, so that it is still running when the
	// second operation arrives.
	fault, err := c.Simulator.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: "join_node", Mode: clv1.Fault_HOLD, Count: 1}})
	if err != nil {
		return fmt.Errorf("inject fault: %w", err)
	}
	name := "client-go-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	op, err := c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
		DisplayName: name, KubernetesVersion: "1.30.2", WorkerNodeCount: 2, ServiceOffering: "medium",
	}})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	md, err := client.MetadataOf(op)
	if err != nil {
		return err
	}
	fmt.Printf("created %s (%s) by %s\n", md.GetCluster(), name, op.GetName())
	if err := waitHeld(ctx, c, op.GetName()); err != nil {
		return err
	}
	if op, err = c.Operations.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: op.GetName()}); err != nil {
		return err
	}

	// A second operation while the create holds the cluster: ABORTED.
	_, err = c.Clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: md.GetCluster()})
	if client.Code(err) != codes.Aborted || client.Reason(err) != client.ReasonOperationInProgress {
		return fmt.Errorf("stop during create = %v; want ABORTED %s", err, client.ReasonOperationInProgress)
	}
	fmt.Printf("stop refused: %s %s (held by %s)\n", client.Code(err), client.Reason(err), client.ErrorInfo(err).GetMetadata()["operation"])
	if _, err := c.Simulator.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: fault.GetName()}); err != nil {
		return fmt.Errorf("release: %w", err)
	}

	done, err := c.Wait(ctx, op, func(md *clv1.OperationMetadata) {
		fmt.Printf("  %s: step %s, %d/%d steps done\n", md.GetVerb(), md.GetStep(), md.GetStepsDone(), md.GetStepsTotal())
	}, client.PollEvery(200*time.Millisecond))
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	cluster, err := client.ClusterOf(done)
	if err != nil {
		return err
	}
	if cluster.GetState() != clv1.Cluster_RUNNING {
		return fmt.Errorf("created cluster is %s; want RUNNING", cluster.GetState())
	}
	if cluster, err = c.Clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: cluster.GetName()}); err != nil {
		return err
	}
	fmt.Printf("%s is %s with %d nodes\n", cluster.GetName(), cluster.GetState(), len(cluster.GetNodes()))

	// An invalid request: INVALID_ARGUMENT with the field's path.
	_, err = c.Clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
		DisplayName: "Not_A_Label", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium",
	}})
	v := client.FieldViolations(err)
	if client.Code(err) != codes.InvalidArgument || len(v) == 0 || v[0].GetField() != "cluster.display_name" {
		return fmt.Errorf("invalid create = %v; want INVALID_ARGUMENT on cluster.display_name", err)
	}
	fmt.Printf("invalid create refused: %s %s on %s: %s\n", client.Code(err), client.Reason(err), v[0].GetField(), v[0].GetDescription())
	return nil
}

// waitHeld returns once the simulator holds a step of operation.
func waitHeld(ctx context.Context, c *client.Client, operation string) error {
	for {
		held, err := c.Simulator.ListHeld(ctx, &clv1.ListHeldRequest{})
		if err != nil {
			return fmt.Errorf("list held: %w", err)
		}
		for _, h := range held.GetHeld() {
			if h.GetOperation() == operation {
				fmt.Printf("  %s held at %s\n", operation, h.GetStep())
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("the create never reached join_node")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
