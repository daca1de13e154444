// Package infra is the infrastructure clusterd's operation workers drive:
// machines with a role and a power state, the Kubernetes node on each, and
// the cluster's network rules. Every call is one named step (the names are
// stable: fault injection and operation metadata use them) and every step is
// idempotent, so an operation that is run again after an interruption
// converges instead of failing on what it already did.
//
// The default implementation is the simulator (package infra/sim); real
// drivers come later behind the same interface.
//
// # Fencing
//
// A job may lose its cluster while it runs: its server is paused, cut off
// or declared dead, or another process took its server id, and a peer's
// recovery has failed the job and taken the cluster over, or a peer has
// adopted the job and runs it on (the same job, a later attempt). Such a job
// must not change anything any more, even in a step that was already on its
// way (held, slow, or sent just before the pause). So every call carries the
// job that makes it and the job's attempt (Call.Operation and Call.Attempt,
// with Call.ClusterID), and a driver must make this promise:
//
//   - A call that changes anything is refused unless, at the moment of the
//     change, the job still holds the cluster: the cluster's current
//     operation is that job, the job is IN_PROGRESS, and the job is still at
//     the call's attempt (an adoption bumps it). A refused call returns an
//     error wrapping ErrFenced and changes nothing.
//   - "At the moment of the change" means atomically with it: the check and
//     the change must be ordered against the writes that take a cluster
//     from a job (a recovery failing the job, a claim, an adoption, the
//     job's own end). The check is the repository's one guard, which locks
//     the cluster's row and then the job's, the order all of those writes
//     keep; a driver never checks the holder by itself. Two hooks give it:
//     repository.Store.Guarded runs a driver's own writes in the guard's
//     transaction (the simulator's machine writes and its call log), and
//     repository.Store.CheckHolder passes the guard alone. A driver whose
//     changes go to an external API that cannot join the transaction calls
//     CheckHolder immediately before and immediately after each change,
//     passes the job id and attempt as the request's idempotency or lease
//     token where the API takes one, and treats a change it cannot fence
//     (the second check refused) as the step's own failure to be repaired.
//     The token is the job id and the attempt together: an adopted job
//     keeps its id, so the id alone would let the old attempt through.
//   - A driver's bookkeeping tables are its own: it creates them with
//     repository.Store.Migrate (the simulator's sim_calls: sim.Migrate)
//     and writes them through repository.Store.Conn, inside Guarded when
//     they record a change. The scanner purges a driver's call log through
//     scanner.CallLogPurger, which the driver implements.
//   - A call with no job, or for a cluster that does not exist, is refused.
//   - Calls that only read (Machines, Machine, Rules) are not fenced.
//
// The job treats ErrFenced as the end of its work: it stops at once, and
// does not repair or release anything, since the cluster belongs to
// someone else. Checking the server's lease before each step (the runner
// does) makes refusals rare; fencing is what makes them harmless.
package infra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Step names, stable: fault injection and OperationMetadata.step use them.
const (
	StepProvisionMachine = "provision_machine"
	StepPowerOn          = "power_on"
	StepPowerOff         = "power_off"
	StepAttachISO        = "attach_iso"
	StepDetachISO        = "detach_iso"
	StepConfigureNetwork = "configure_network"
	StepJoinNode         = "join_node"
	StepWaitAPI          = "wait_api"
	StepFetchKubeconfig  = "fetch_kubeconfig"
	StepDeployProvider   = "deploy_provider"
	StepDeployAutoscaler = "deploy_autoscaler"
	StepDrainNode        = "drain_node"
	// StepUncordonNode lets work back onto a node that an interrupted drain
	// left cordoned (recovery's repair; an upgrade uncordons in upgrade_node).
	StepUncordonNode   = "uncordon_node"
	StepDeleteNode     = "delete_node"
	StepUpgradeNode    = "upgrade_node"
	StepValidateNode   = "validate_node"
	StepDestroyMachine = "destroy_machine"
	// StepResizeMachine changes a machine's service offering (a scale of the
	// offering); the model does it as a VM scale, which has no name in the
	// step list above.
	StepResizeMachine = "resize_machine"
)

// Steps lists every step name, for validating fault injection requests.
func Steps() []string {
	return []string{
		StepProvisionMachine, StepPowerOn, StepPowerOff, StepAttachISO, StepDetachISO,
		StepConfigureNetwork, StepJoinNode, StepWaitAPI, StepFetchKubeconfig, StepDeployProvider,
		StepDeployAutoscaler, StepDrainNode, StepDeleteNode, StepUpgradeNode, StepValidateNode,
		StepDestroyMachine, StepResizeMachine, StepUncordonNode,
	}
}

// Role is what a machine does in a cluster.
type Role string

// Roles.
const (
	RoleControl  Role = "CONTROL"
	RoleWorker   Role = "WORKER"
	RoleExternal Role = "EXTERNAL" // belongs to no cluster; AddNodes can take it
)

// Power is a machine's power state.
type Power string

// Power states.
const (
	PowerRunning Power = "RUNNING"
	PowerStopped Power = "STOPPED"
)

// Machine is one (simulated or real) virtual machine.
type Machine struct {
	ID string
	// ClusterID is the cluster the machine belongs to; empty for a free one.
	ClusterID         string
	Role              Role
	Power             Power
	Joined            bool
	Cordoned          bool
	KubernetesVersion string
	AttachedISO       string
	Offering          string
	CreateTime        time.Time
}

// Rule lets traffic reach a machine: kind is "api" (control nodes, 6443),
// "ssh" (every node, 22) or "nodeport".
type Rule struct {
	MachineID string
	Kind      string
	Port      int32
}

// Call says who runs a step. Operation, the job making the call, and
// Attempt, with ClusterID, are the fencing token (see the package doc): a
// driver refuses the call unless that job, at that attempt, still holds that
// cluster. Fault injection matches on the cluster, and the simulator lists
// held steps with their operation and machine.
type Call struct {
	ClusterID string
	// Operation is the id of the job making the call.
	Operation string
	// Attempt is the job's attempt (repository.Job.Attempt): 1 on the server
	// that claimed it, one more after each adoption. Zero is not checked
	// (callers that predate adoption).
	Attempt   int32
	MachineID string
}

// NodeCredentials is what a node is handed of its cluster's credentials
// when it joins: a control node gets the CA's certificate and key (its init
// signs the cluster's other certificates with them, as kubeadm's init does
// with a CA it is given); a worker the CA certificate only (to trust the
// API server). PEM; both empty for a cluster without credentials. A driver
// must never log or store CAKey in the clear.
type NodeCredentials struct {
	CACert []byte
	CAKey  []byte
}

// ErrNotFound: the machine does not exist.
var ErrNotFound = errors.New("machine not found")

// ErrFenced: the call was refused because its job no longer holds the
// cluster (see Fencing in the package doc). Nothing was changed; the job
// must stop.
var ErrFenced = errors.New("job no longer holds the cluster")

// ErrUnusable: a machine cannot be used as asked (AddNodes of a machine that
// is not a free, running EXTERNAL machine; taken concurrently by another
// cluster). It is a permanent failure of the step, not a fault.
var ErrUnusable = errors.New("machine not usable")

// Infrastructure is what operation workers drive. Every method that changes
// something is a step: it is named by one of the Step constants, honours
// ctx, and is idempotent.
type Infrastructure interface {
	// Machines lists the machines of the given clusters (all machines of
	// all clusters and free ones when none is given), oldest first.
	Machines(ctx context.Context, clusterIDs ...string) ([]Machine, error)
	// Machine reads one machine (ErrNotFound).
	Machine(ctx context.Context, id string) (Machine, error)
	// Rules lists a cluster's network rules (reading them is not a step).
	Rules(ctx context.Context, clusterID string) ([]Rule, error)

	// ProvisionMachine (provision_machine) creates machine id for the call's
	// cluster, powered on, not joined. The caller picks the id (stable per
	// operation and slot), so a rerun finds it instead of creating another.
	ProvisionMachine(ctx context.Context, c Call, id string, role Role, offering, version string) (Machine, error)
	// PowerOn (power_on) and PowerOff (power_off) set c.MachineID's power.
	PowerOn(ctx context.Context, c Call) error
	PowerOff(ctx context.Context, c Call) error
	// ResizeMachine (resize_machine) changes c.MachineID's offering.
	ResizeMachine(ctx context.Context, c Call, offering string) error
	// AttachISO (attach_iso) and DetachISO (detach_iso) on c.MachineID.
	AttachISO(ctx context.Context, c Call, iso string) error
	DetachISO(ctx context.Context, c Call) error
	// ConfigureNetwork (configure_network) converges the call's cluster's
	// rules to want: missing rules are added before extra ones are removed,
	// so no machine is ever without its rules.
	ConfigureNetwork(ctx context.Context, c Call, want []Rule) error
	// JoinNode (join_node) joins c.MachineID to its cluster's Kubernetes,
	// installing version (an adopted external machine runs none before),
	// handing it the cluster's credentials (kubeadm's init on a control
	// node, its join on a worker; empty for a cluster made before clusterd
	// kept credentials).
	JoinNode(ctx context.Context, c Call, version string, creds NodeCredentials) error
	// WaitAPI (wait_api) waits for the cluster's API server and returns its endpoint.
	WaitAPI(ctx context.Context, c Call) (endpoint string, err error)
	// FetchKubeconfig (fetch_kubeconfig) and DeployProvider (deploy_provider) finish a cluster.
	FetchKubeconfig(ctx context.Context, c Call) error
	DeployProvider(ctx context.Context, c Call) error
	// DeployAutoscaler (deploy_autoscaler) deploys or removes the autoscaler.
	DeployAutoscaler(ctx context.Context, c Call, enabled bool, minSize, maxSize int32) error
	// DrainNode (drain_node) cordons and drains c.MachineID.
	DrainNode(ctx context.Context, c Call) error
	// UncordonNode (uncordon_node) lets work back onto c.MachineID.
	UncordonNode(ctx context.Context, c Call) error
	// DeleteNode (delete_node) removes c.MachineID from Kubernetes and from
	// its cluster; the machine becomes a free EXTERNAL machine.
	DeleteNode(ctx context.Context, c Call) error
	// UpgradeNode (upgrade_node) upgrades c.MachineID to version and uncordons it.
	UpgradeNode(ctx context.Context, c Call, version string) error
	// ValidateNode (validate_node) checks that c.MachineID is a free, running
	// EXTERNAL machine and assigns it to the call's cluster as a worker
	// (ErrUnusable otherwise). Idempotent: a machine already assigned to the
	// call's cluster validates.
	ValidateNode(ctx context.Context, c Call) error
	// DestroyMachine (destroy_machine) deletes c.MachineID; a machine that is gone is destroyed.
	DestroyMachine(ctx context.Context, c Call) error
}

// Mismatch says how a cluster's machines differ from what a healthy
// cluster's record says of them (SPEC §5.2): every machine powered on,
// joined to Kubernetes and running the recorded version. It names each
// machine that is not ("machine m1 is STOPPED; machine m2 has not joined")
// and the versions when a node runs another ("nodes run 1.30.5 on 2 nodes,
// not the recorded 1.30.2"), and is empty when they match. No machines at
// all do not match. It is the one comparison of machines with the record:
// an operation's end before it leaves a cluster RUNNING, and
// reconciliation of RUNNING and ALERT clusters, both use it.
func Mismatch(machines []Machine, version string) string {
	if len(machines) == 0 {
		return "the cluster has no machines"
	}
	var parts []string
	for _, m := range machines {
		switch {
		case m.Power != PowerRunning:
			parts = append(parts, fmt.Sprintf("machine %s is %s", m.ID, m.Power))
		case !m.Joined:
			parts = append(parts, fmt.Sprintf("machine %s has not joined", m.ID))
		}
	}
	if v := VersionsOff(machines, version); v != "" {
		parts = append(parts, v)
	}
	return strings.Join(parts, "; ")
}

// nodes is "node" or "nodes" for n.
func nodes(n int) string {
	if n == 1 {
		return "node"
	}
	return "nodes"
}

// VersionsOff says which Kubernetes versions a cluster's nodes run when
// any runs one other than the recorded version ("nodes run 1.30.2 on 2
// nodes, 1.30.5 on 1 node, not the recorded 1.30.2"), and is empty when
// they all run it: a mixed set, and nodes that all run another version
// (an upgrade cancelled after its last node), alike. Machines that run no
// version yet (not joined) are not counted. Such a cluster is not healthy,
// whatever its power (SPEC §5.2); an upgrade makes the record equal.
func VersionsOff(machines []Machine, version string) string {
	count := map[string]int{}
	differ := false
	for _, m := range machines {
		if m.KubernetesVersion != "" {
			count[m.KubernetesVersion]++
			differ = differ || m.KubernetesVersion != version
		}
	}
	if !differ {
		return ""
	}
	versions := slices.Sorted(maps.Keys(count))
	runs := make([]string, len(versions))
	for i, v := range versions {
		runs[i] = fmt.Sprintf("%s on %d %s", v, count[v], nodes(count[v]))
	}
	return fmt.Sprintf("nodes run %s, not the recorded %s", strings.Join(runs, ", "), version)
}
