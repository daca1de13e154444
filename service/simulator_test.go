package service_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// The Simulator handlers run over a real simulator on every backend.
func forEachSimulator(t *testing.T, fn func(t *testing.T, b *sim.Simulator, h *service.Simulator)) {
	t.Helper()
	for _, be := range repotest.Backends(t) {
		t.Run(be.Name, func(t *testing.T) {
			store := repotest.Open(t, be)
			b, err := sim.Open(context.Background(), store, sim.Config{})
			if err != nil {
				t.Fatal(err)
			}
			simStores.Store(b, store)
			t.Cleanup(func() { simStores.Delete(b) })
			fn(t, b, service.NewSimulator(b))
		})
	}
}

// simStores is each test simulator's store, for heldCluster.
var simStores sync.Map // *sim.Simulator -> *repository.Store

// heldCluster makes a cluster held by a job, as a claim would, and returns
// both ids: every simulated step must name a job that holds its cluster.
func heldCluster(t *testing.T, b *sim.Simulator) (clusterID, op string) {
	t.Helper()
	v, _ := simStores.Load(b)
	c, j, err := v.(*repository.Store).CreateCluster(simCtx(t),
		repository.NewCluster{Account: "acme", DisplayName: "sim", Spec: repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return c.ID, j.ID
}

func simCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantCode checks the gRPC code an error maps to and, for INVALID_ARGUMENT,
// the field the BadRequest names.
func wantCode(t *testing.T, what string, err error, code codes.Code, field string) {
	t.Helper()
	st := service.Status(err)
	if st.Code() != code {
		t.Errorf("%s: code = %v (%v); want %v", what, st.Code(), err, code)
		return
	}
	if field == "" {
		return
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if !slices.Contains(fields, field) {
		t.Errorf("%s: violations name %v; want %s", what, fields, field)
	}
}

func TestSimulatorMachines(t *testing.T) {
	forEachSimulator(t, func(t *testing.T, b *sim.Simulator, h *service.Simulator) {
		ctx := simCtx(t)
		free, err := h.CreateMachine(ctx, &clv1.CreateMachineRequest{Role: clv1.Node_EXTERNAL})
		if err != nil {
			t.Fatalf("CreateMachine: %v", err)
		}
		id, ok := cutMachine(free.GetName())
		want := &clv1.Machine{Name: free.GetName(), Role: clv1.Node_EXTERNAL, Power: clv1.Node_RUNNING}
		if !ok || !proto.Equal(free, want) {
			t.Errorf("CreateMachine = %v; want a free running EXTERNAL machines/{uuid}", free)
		}

		clusterID, op := heldCluster(t, b)
		nodeID := uuid.NewString()
		if _, err := b.ProvisionMachine(ctx, infra.Call{ClusterID: clusterID, Operation: op}, nodeID, infra.RoleControl, "medium", "1.30.2"); err != nil {
			t.Fatal(err)
		}
		if err := b.AttachISO(ctx, infra.Call{ClusterID: clusterID, Operation: op, MachineID: nodeID}, "k.iso"); err != nil {
			t.Fatal(err)
		}
		node := &clv1.Machine{
			Name: "machines/" + nodeID, Cluster: "clusters/" + clusterID, Role: clv1.Node_CONTROL,
			Power: clv1.Node_RUNNING, KubernetesVersion: "1.30.2", AttachedIso: "k.iso",
		}

		all, err := h.ListMachines(ctx, &clv1.ListMachinesRequest{})
		if err != nil || len(all.GetMachines()) != 2 || !proto.Equal(all.GetMachines()[0], free) || !proto.Equal(all.GetMachines()[1], node) {
			t.Errorf("ListMachines() = %v, %v; want [%v %v]", all, err, free, node)
		}
		one, err := h.ListMachines(ctx, &clv1.ListMachinesRequest{Cluster: "clusters/" + clusterID})
		if err != nil || len(one.GetMachines()) != 1 || !proto.Equal(one.GetMachines()[0], node) {
			t.Errorf("ListMachines(cluster) = %v, %v; want [%v]", one, err, node)
		}

		stopped, err := h.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: free.GetName(), Power: clv1.Node_STOPPED})
		if err != nil || stopped.GetPower() != clv1.Node_STOPPED {
			t.Errorf("SetMachinePower(STOPPED) = %v, %v", stopped, err)
		}
		if m, _ := b.Machine(ctx, id); m.Power != infra.PowerStopped {
			t.Errorf("machine power = %s; want STOPPED", m.Power)
		}
		_, err = h.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: "machines/" + uuid.NewString(), Power: clv1.Node_RUNNING})
		wantCode(t, "SetMachinePower of a missing machine", err, codes.NotFound, "")
	})
}

func cutMachine(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, "machines/")
	return id, ok && uuid.Validate(id) == nil && len(id) == 36
}

func TestSimulatorRefusesInvalidRequests(t *testing.T) {
	b := sim.New(nil, sim.Config{}) // validation never reaches the store
	h := service.NewSimulator(b)
	ctx := simCtx(t)
	fault := func(f *clv1.Fault) func() error {
		return func() error { _, err := h.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: f}); return err }
	}
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"list machines of a bad cluster name", func() error {
			_, err := h.ListMachines(ctx, &clv1.ListMachinesRequest{Cluster: "clusters/x"})
			return err
		}, "cluster"},
		{"create without role", func() error {
			_, err := h.CreateMachine(ctx, &clv1.CreateMachineRequest{})
			return err
		}, "role"},
		{"create a worker", func() error {
			_, err := h.CreateMachine(ctx, &clv1.CreateMachineRequest{Role: clv1.Node_WORKER})
			return err
		}, "role"},
		{"create a control machine", func() error {
			_, err := h.CreateMachine(ctx, &clv1.CreateMachineRequest{Role: clv1.Node_CONTROL})
			return err
		}, "role"},
		{"power of a bad name", func() error {
			_, err := h.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: "vms/1", Power: clv1.Node_RUNNING})
			return err
		}, "name"},
		{"power unspecified", func() error {
			_, err := h.SetMachinePower(ctx, &clv1.SetMachinePowerRequest{Name: "machines/" + uuid.NewString()})
			return err
		}, "power"},
		{"no fault", fault(nil), "fault"},
		{"unknown step", fault(&clv1.Fault{Step: "reboot", Mode: clv1.Fault_FAIL}), "fault.step"},
		{"no mode", fault(&clv1.Fault{Step: infra.StepJoinNode}), "fault.mode"},
		{"bad cluster", fault(&clv1.Fault{Step: infra.StepJoinNode, Mode: clv1.Fault_FAIL, Cluster: "c1"}), "fault.cluster"},
		{"negative count", fault(&clv1.Fault{Step: infra.StepJoinNode, Mode: clv1.Fault_FAIL, Count: -1}), "fault.count"},
		{"delay without duration", fault(&clv1.Fault{Step: infra.StepJoinNode, Mode: clv1.Fault_DELAY}), "fault.delay"},
		{"negative delay", fault(&clv1.Fault{Step: infra.StepJoinNode, Mode: clv1.Fault_DELAY, Delay: durationpb.New(-time.Second)}), "fault.delay"},
		{"duration on a hold", fault(&clv1.Fault{Step: infra.StepJoinNode, Mode: clv1.Fault_HOLD, Delay: durationpb.New(time.Second)}), "fault.delay"},
		{"release nothing", func() error {
			_, err := h.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{})
			return err
		}, "fault"},
		{"release both", func() error {
			_, err := h.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: "faults/f-1", All: true})
			return err
		}, "fault"},
		{"release a bad fault name", func() error {
			_, err := h.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: "f-1"})
			return err
		}, "fault"},
		{"rules without cluster", func() error {
			_, err := h.ListNetworkRules(ctx, &clv1.ListNetworkRulesRequest{})
			return err
		}, "cluster"},
	}
	for _, tt := range tests {
		wantCode(t, tt.name, tt.call(), codes.InvalidArgument, tt.field)
	}
	if fs := b.Faults(); len(fs) != 0 {
		t.Errorf("refused requests injected faults: %+v", fs)
	}
}

func TestSimulatorFaults(t *testing.T) {
	forEachSimulator(t, func(t *testing.T, b *sim.Simulator, h *service.Simulator) {
		ctx := simCtx(t)
		clusterID, op := heldCluster(t, b)
		f, err := h.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{
			Step: infra.StepProvisionMachine, Mode: clv1.Fault_HOLD, Cluster: "clusters/" + clusterID, Count: 1,
		}})
		if err != nil {
			t.Fatalf("InjectFault: %v", err)
		}
		want := &clv1.Fault{Name: f.GetName(), Step: infra.StepProvisionMachine, Mode: clv1.Fault_HOLD, Cluster: "clusters/" + clusterID, Count: 1}
		if !proto.Equal(f, want) || !strings.HasPrefix(f.GetName(), "faults/f-") {
			t.Errorf("InjectFault = %v; want %v named faults/{id}", f, want)
		}

		nodeID := uuid.NewString()
		done := make(chan error, 1)
		go func() {
			_, err := b.ProvisionMachine(ctx, infra.Call{ClusterID: clusterID, Operation: op}, nodeID, infra.RoleWorker, "medium", "1.30.2")
			done <- err
		}()
		if _, err := b.WaitHeld(ctx, nil); err != nil {
			t.Fatal(err)
		}
		held, err := h.ListHeld(ctx, &clv1.ListHeldRequest{})
		if err != nil || len(held.GetHeld()) != 1 {
			t.Fatalf("ListHeld = %v, %v; want one held step", held, err)
		}
		got := held.GetHeld()[0]
		wantHeld := &clv1.HeldStep{
			Fault: f.GetName(), Step: infra.StepProvisionMachine, Cluster: "clusters/" + clusterID,
			Operation: "operations/" + op, Machine: "machines/" + nodeID, HoldTime: got.GetHoldTime(),
		}
		if !proto.Equal(got, wantHeld) || got.GetHoldTime() == nil {
			t.Errorf("held step = %v; want %v", got, wantHeld)
		}

		_, err = h.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: "faults/f-999"})
		wantCode(t, "ReleaseHeld of an unknown fault", err, codes.NotFound, "")
		if _, err := h.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{Fault: f.GetName()}); err != nil {
			t.Fatalf("ReleaseHeld: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("released provision_machine: %v", err)
		}

		delay, err := h.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{
			Step: infra.StepWaitAPI, Mode: clv1.Fault_DELAY, Delay: durationpb.New(2 * time.Second),
		}})
		if err != nil || delay.GetDelay().AsDuration() != 2*time.Second || delay.GetCluster() != "" || delay.GetMode() != clv1.Fault_DELAY {
			t.Errorf("InjectFault(DELAY) = %v, %v", delay, err)
		}
		if _, err := h.InjectFault(ctx, &clv1.InjectFaultRequest{Fault: &clv1.Fault{Step: infra.StepJoinNode, Mode: clv1.Fault_HOLD}}); err != nil {
			t.Fatal(err)
		}
		go func() {
			done <- b.JoinNode(ctx, infra.Call{ClusterID: clusterID, Operation: op, MachineID: nodeID}, "1.30.2", infra.NodeCredentials{})
		}()
		if _, err := b.WaitHeld(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := h.ReleaseHeld(ctx, &clv1.ReleaseHeldRequest{All: true}); err != nil {
			t.Fatalf("ReleaseHeld(all): %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("released join_node: %v", err)
		}

		if _, err := h.ClearFaults(ctx, &clv1.ClearFaultsRequest{}); err != nil {
			t.Fatal(err)
		}
		if fs := b.Faults(); len(fs) != 0 {
			t.Errorf("faults after ClearFaults = %+v", fs)
		}
	})
}

func TestSimulatorListNetworkRules(t *testing.T) {
	forEachSimulator(t, func(t *testing.T, b *sim.Simulator, h *service.Simulator) {
		ctx := simCtx(t)
		clusterID, op := heldCluster(t, b)
		nodeID := uuid.NewString()
		call := infra.Call{ClusterID: clusterID, Operation: op}
		if _, err := b.ProvisionMachine(ctx, call, nodeID, infra.RoleControl, "medium", "1.30.2"); err != nil {
			t.Fatal(err)
		}
		if err := b.ConfigureNetwork(ctx, call, []infra.Rule{{MachineID: nodeID, Kind: "ssh", Port: 22}, {MachineID: nodeID, Kind: "api", Port: 6443}}); err != nil {
			t.Fatal(err)
		}
		got, err := h.ListNetworkRules(ctx, &clv1.ListNetworkRulesRequest{Cluster: "clusters/" + clusterID})
		if err != nil {
			t.Fatal(err)
		}
		want := &clv1.ListNetworkRulesResponse{Rules: []*clv1.NetworkRule{
			{Machine: "machines/" + nodeID, Kind: "api", Port: 6443},
			{Machine: "machines/" + nodeID, Kind: "ssh", Port: 22},
		}}
		if !proto.Equal(got, want) {
			t.Errorf("ListNetworkRules = %v; want %v", got, want)
		}
		other, err := h.ListNetworkRules(ctx, &clv1.ListNetworkRulesRequest{Cluster: "clusters/" + uuid.NewString()})
		if err != nil || len(other.GetRules()) != 0 {
			t.Errorf("rules of a cluster without any = %v, %v; want none", other, err)
		}
	})
}
