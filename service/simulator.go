package service

import (
	"context"
	"errors"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim/fault"
)

// faultPrefix names injected faults (`faults/{id}`); their ids are the
// simulator's ("f-1"), not UUIDs, because faults live only in one process.
const faultPrefix = "faults/"

// SimulatorBackend is what the Simulator handlers need of the simulated
// infrastructure (*sim.Simulator), declared here so the handlers depend on
// behaviour, not on the simulator's storage.
type SimulatorBackend interface {
	Machines(ctx context.Context, clusterIDs ...string) ([]infra.Machine, error)
	CreateMachine(ctx context.Context, role infra.Role) (infra.Machine, error)
	SetMachinePower(ctx context.Context, id string, p infra.Power) (infra.Machine, error)
	InjectFault(f fault.Fault) (fault.Fault, error)
	ListHeld() []fault.Held
	ReleaseHeld(faultID string) (int, error)
	ReleaseAll() int
	ClearFaults()
	Rules(ctx context.Context, clusterID string) ([]infra.Rule, error)
}

// Simulator implements clusterlifecycle.v1.Simulator: demos and tests use it
// to see the machines, change them behind the operations' backs, and fail,
// delay or hold steps to order events without sleeping.
type Simulator struct {
	clv1.UnimplementedSimulatorServer
	sim SimulatorBackend
}

// NewSimulator returns the Simulator handlers over b; register them only
// when the simulator is the infrastructure.
func NewSimulator(b SimulatorBackend) *Simulator {
	return &Simulator{sim: b}
}

// ListMachines lists one cluster's machines, or every machine (free ones
// too) when no cluster is given, oldest first.
func (s *Simulator) ListMachines(ctx context.Context, req *clv1.ListMachinesRequest) (*clv1.ListMachinesResponse, error) {
	var clusters []string
	if req.GetCluster() != "" {
		id, err := parseName("cluster", req.GetCluster(), clusterPrefix)
		if err != nil {
			return nil, err
		}
		clusters = append(clusters, id)
	}
	ms, err := s.sim.Machines(ctx, clusters...)
	if err != nil {
		return nil, err
	}
	resp := &clv1.ListMachinesResponse{Machines: make([]*clv1.Machine, len(ms))}
	for i, m := range ms {
		resp.Machines[i] = toSimMachine(m)
	}
	return resp, nil
}

// CreateMachine adds a free EXTERNAL machine for AddNodes to take. Control
// and worker machines are refused: clusters provision their own.
func (s *Simulator) CreateMachine(ctx context.Context, req *clv1.CreateMachineRequest) (*clv1.Machine, error) {
	switch req.GetRole() {
	case clv1.Node_EXTERNAL:
	case clv1.Node_ROLE_UNSPECIFIED:
		return nil, invalid("role", "is required, and must be EXTERNAL")
	default:
		return nil, invalid("role", "must be EXTERNAL, not %s: clusters provision their own control and worker machines", req.GetRole())
	}
	m, err := s.sim.CreateMachine(ctx, infra.RoleExternal)
	if err != nil {
		return nil, err
	}
	return toSimMachine(m), nil
}

// SetMachinePower powers a machine on or off out of band, as an operator or
// an outage would, for the scanner to notice.
func (s *Simulator) SetMachinePower(ctx context.Context, req *clv1.SetMachinePowerRequest) (*clv1.Machine, error) {
	var v violations
	id, err := parseName("name", req.GetName(), machinePrefix)
	addParsed(&v, "name", err)
	var p infra.Power
	switch req.GetPower() {
	case clv1.Node_RUNNING:
		p = infra.PowerRunning
	case clv1.Node_STOPPED:
		p = infra.PowerStopped
	default:
		v.add("power", "is required: RUNNING or STOPPED")
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	m, err := s.sim.SetMachinePower(ctx, id, p)
	if errors.Is(err, infra.ErrNotFound) {
		return nil, &NotFoundError{Name: req.GetName()}
	}
	if err != nil {
		return nil, err
	}
	return toSimMachine(m), nil
}

// faultModes maps the API's fault modes to the simulator's.
var faultModes = map[clv1.Fault_Mode]fault.Mode{
	clv1.Fault_FAIL:  fault.Fail,
	clv1.Fault_DELAY: fault.Delay,
	clv1.Fault_HOLD:  fault.Hold,
}

// InjectFault makes the named step fail, slow down or block until released,
// for every cluster or one; it answers with the fault's name for
// ReleaseHeld.
func (s *Simulator) InjectFault(_ context.Context, req *clv1.InjectFaultRequest) (*clv1.Fault, error) {
	in := req.GetFault()
	if in == nil {
		return nil, invalid("fault", "is required")
	}
	var v violations
	f := fault.Fault{Step: in.GetStep(), Count: in.GetCount()}
	if !slices.Contains(infra.Steps(), f.Step) {
		v.add("fault.step", "%q is not a step; one of %s", Clip(f.Step), strings.Join(infra.Steps(), ", "))
	}
	mode, ok := faultModes[in.GetMode()]
	if !ok {
		v.add("fault.mode", "is required: FAIL, DELAY or HOLD")
	}
	f.Mode = mode
	if in.GetCluster() != "" {
		id, err := parseName("fault.cluster", in.GetCluster(), clusterPrefix)
		addParsed(&v, "fault.cluster", err)
		f.ClusterID = id
	}
	if f.Count < 0 {
		v.add("fault.count", "must be 0 (until cleared) or more, not %d", f.Count)
	}
	if d := in.GetDelay(); d != nil {
		if err := d.CheckValid(); err != nil {
			v.add("fault.delay", "is not a valid duration: %v", err)
		}
		f.Delay = d.AsDuration()
	}
	switch {
	case mode == fault.Delay && f.Delay <= 0:
		v.add("fault.delay", "is required for a DELAY fault and must be positive")
	case ok && mode != fault.Delay && f.Delay != 0:
		v.add("fault.delay", "is only for DELAY faults, not %s", mode)
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	got, err := s.sim.InjectFault(f)
	if errors.Is(err, fault.ErrInvalid) {
		return nil, invalid("fault", "%v", err)
	}
	if err != nil {
		return nil, err
	}
	return toFault(got), nil
}

// ListHeld lists the steps HOLD faults are blocking now, oldest first.
func (s *Simulator) ListHeld(context.Context, *clv1.ListHeldRequest) (*clv1.ListHeldResponse, error) {
	held := s.sim.ListHeld()
	resp := &clv1.ListHeldResponse{Held: make([]*clv1.HeldStep, len(held))}
	for i, h := range held {
		resp.Held[i] = &clv1.HeldStep{
			Fault:     faultPrefix + h.FaultID,
			Step:      h.Step,
			Cluster:   optionalName(clusterPrefix, h.ClusterID),
			Operation: operationName(h.Operation),
			Machine:   optionalName(machinePrefix, h.MachineID),
			HoldTime:  timestamppb.New(h.Since),
		}
	}
	return resp, nil
}

// ReleaseHeld lets the steps one fault holds, or all held steps, go on.
func (s *Simulator) ReleaseHeld(_ context.Context, req *clv1.ReleaseHeldRequest) (*emptypb.Empty, error) {
	switch {
	case req.GetAll() && req.GetFault() != "":
		return nil, invalid("fault", "set either fault or all, not both")
	case req.GetAll():
		s.sim.ReleaseAll()
		return &emptypb.Empty{}, nil
	case req.GetFault() == "":
		return nil, invalid("fault", "is required (faults/{id}) unless all is set")
	}
	id, ok := strings.CutPrefix(req.GetFault(), faultPrefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		return nil, invalid("fault", "%q is not a faults/{id} name", Clip(req.GetFault()))
	}
	if _, err := s.sim.ReleaseHeld(id); err != nil {
		if errors.Is(err, fault.ErrUnknown) {
			return nil, &NotFoundError{Name: req.GetFault()}
		}
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// ClearFaults removes every fault and releases every held step.
func (s *Simulator) ClearFaults(context.Context, *clv1.ClearFaultsRequest) (*emptypb.Empty, error) {
	s.sim.ClearFaults()
	return &emptypb.Empty{}, nil
}

// ListNetworkRules lists a cluster's network rules, by machine, kind and port.
func (s *Simulator) ListNetworkRules(ctx context.Context, req *clv1.ListNetworkRulesRequest) (*clv1.ListNetworkRulesResponse, error) {
	id, err := parseName("cluster", req.GetCluster(), clusterPrefix)
	if err != nil {
		return nil, err
	}
	rules, err := s.sim.Rules(ctx, id)
	if err != nil {
		return nil, err
	}
	resp := &clv1.ListNetworkRulesResponse{Rules: make([]*clv1.NetworkRule, len(rules))}
	for i, r := range rules {
		resp.Rules[i] = &clv1.NetworkRule{Machine: machinePrefix + r.MachineID, Kind: r.Kind, Port: r.Port}
	}
	return resp, nil
}

func toSimMachine(m infra.Machine) *clv1.Machine {
	return &clv1.Machine{
		Name:              machinePrefix + m.ID,
		Cluster:           optionalName(clusterPrefix, m.ClusterID),
		Role:              clv1.Node_Role(clv1.Node_Role_value[string(m.Role)]),
		Power:             clv1.Node_Power(clv1.Node_Power_value[string(m.Power)]),
		Joined:            m.Joined,
		Cordoned:          m.Cordoned,
		KubernetesVersion: m.KubernetesVersion,
		AttachedIso:       m.AttachedISO,
	}
}

func toFault(f fault.Fault) *clv1.Fault {
	out := &clv1.Fault{
		Name:    faultPrefix + f.ID,
		Step:    f.Step,
		Cluster: optionalName(clusterPrefix, f.ClusterID),
		Count:   f.Count,
	}
	for m, mode := range faultModes {
		if mode == f.Mode {
			out.Mode = m
		}
	}
	if f.Delay != 0 {
		out.Delay = durationpb.New(f.Delay)
	}
	return out
}

// optionalName is prefix+id, or empty when there is no id.
func optionalName(prefix, id string) string {
	if id == "" {
		return ""
	}
	return prefix + id
}

// addParsed adds a parseName error's violations to v, so that one response
// lists every bad field.
func addParsed(v *violations, field string, err error) {
	var inval *InvalidArgumentError
	switch {
	case errors.As(err, &inval):
		*v = append(*v, inval.Violations...)
	case err != nil:
		v.add(field, "%v", err)
	}
}
