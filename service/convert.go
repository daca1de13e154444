package service

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// Resource name prefixes (AIP-122).
const (
	clusterPrefix   = "clusters/"
	operationPrefix = "operations/"
	machinePrefix   = "machines/"
)

// parseName checks that name is prefix followed by a UUID and returns the
// UUID, so malformed names are INVALID_ARGUMENT, not NOT_FOUND.
func parseName(field, name, prefix string) (string, error) {
	if name == "" {
		return "", invalid(field, "is required (%s{uuid})", prefix)
	}
	id, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return "", invalid(field, "%q is not a %s{uuid} name", Clip(name), prefix)
	}
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return "", invalid(field, "%q does not end in a UUID", Clip(name))
	}
	return strings.ToLower(id), nil
}

func clusterName(id string) string { return clusterPrefix + id }

func operationName(id string) string {
	if id == "" {
		return ""
	}
	return operationPrefix + id
}

// etag is the cluster's version: it changes on every write (AIP-154).
func etag(c repository.Cluster) string { return strconv.FormatInt(c.Version, 10) }

// clusterState maps the state machine's states to the API enum; the names
// are the same by design, so the mapping is by name.
func clusterState(s lifecycle.State) clv1.Cluster_State {
	return clv1.Cluster_State(clv1.Cluster_State_value[s.String()])
}

// toNode presents a machine of the cluster named display as one of its
// nodes.
func toNode(display string, m infra.Machine) *clv1.Node {
	return &clv1.Node{
		Name:              machinePrefix + m.ID,
		DisplayName:       nodeDisplayName(display, m),
		Role:              clv1.Node_Role(clv1.Node_Role_value[string(m.Role)]),
		Power:             clv1.Node_Power(clv1.Node_Power_value[string(m.Power)]),
		Joined:            m.Joined,
		KubernetesVersion: m.KubernetesVersion,
	}
}

// nodeDisplayName names a node as people name machines: cluster, role and
// the end of its machine id (the random or hashed part of every UUID
// version clusterd makes), stable for the machine's life.
func nodeDisplayName(display string, m infra.Machine) string {
	role := strings.ToLower(string(m.Role))
	id := strings.ReplaceAll(m.ID, "-", "")
	return display + "-" + role + "-" + id[max(0, len(id)-8):]
}

func toCluster(c repository.Cluster) *clv1.Cluster {
	out := &clv1.Cluster{
		Name:              clusterName(c.ID),
		DisplayName:       c.DisplayName,
		Description:       c.Description,
		Account:           c.Account,
		State:             clusterState(c.State),
		KubernetesVersion: c.Spec.KubernetesVersion,
		ControlNodeCount:  c.Spec.ControlNodeCount,
		WorkerNodeCount:   c.Spec.WorkerNodeCount,
		ServiceOffering:   c.Spec.ServiceOffering,
		ControlOffering:   c.Spec.ControlOfferingOrDefault(),
		Endpoint:          c.Endpoint,
		CurrentOperation:  operationName(c.CurrentOperation),
		Etag:              etag(c),
		CreateTime:        timestamppb.New(c.CreateTime),
		UpdateTime:        timestamppb.New(c.UpdateTime),
		StatusMessage:     c.Status.Message,
		NextStep:          nextStep(c.State),
	}
	if c.Status.Time != nil {
		out.StatusTime = timestamppb.New(*c.Status.Time)
	}
	if a := c.Spec.Autoscaling; a != (repository.Autoscaling{}) {
		out.Autoscaling = &clv1.Autoscaling{Enabled: a.Enabled, MinSize: a.MinSize, MaxSize: a.MaxSize}
	}
	return out
}

func toEvent(e repository.Event) *clv1.ClusterEvent {
	return &clv1.ClusterEvent{
		Name:      fmt.Sprintf("%s/events/%d", clusterName(e.ClusterID), e.ID),
		Time:      timestamppb.New(e.Time),
		FromState: clusterState(e.From),
		Event:     e.Name,
		ToState:   clusterState(e.To),
		Operation: operationName(e.Operation),
		Server:    e.Server,
		Message:   e.Message,
	}
}

// jobError is a failed or cancelled job's error as the client sees it: the
// stored google.rpc.Status, given an ErrorInfo when it has none (rows written
// before every end was encoded by EncodeJobError, or by the plain encoder).
func jobError(j repository.Job) *spb.Status {
	st := &spb.Status{}
	if err := protojson.Unmarshal([]byte(j.Error), st); err != nil || st.Code == 0 {
		st = &spb.Status{Code: int32(codes.Unknown), Message: boundCause(fmt.Sprintf("operation ended %s: %s", j.Status, j.Error))}
		if j.Status == repository.JobCancelled {
			st.Code = int32(codes.Canceled)
		}
	}
	for _, d := range st.GetDetails() {
		if d.MessageIs(&errdetails.ErrorInfo{}) {
			return st
		}
	}
	reason := codeReason(codes.Code(st.GetCode()))
	if j.Status == repository.JobCancelled {
		reason = ReasonCancelled
	}
	if info, err := anypb.New(&errdetails.ErrorInfo{Reason: reason, Domain: Domain}); err == nil {
		st.Details = append(st.Details, info)
	}
	return st
}

// targetWorkers is the worker count a scale or AddNodes job leads to, as
// its claim stored it (0 for other jobs, and for those claimed before the
// count was stored).
func targetWorkers(j repository.Job) int32 {
	if j.Kind != VerbScale && j.Kind != VerbAddNodes {
		return 0
	}
	var p struct {
		Target int32 `json:"target"`
	}
	if err := json.Unmarshal([]byte(j.Params), &p); err != nil {
		return 0
	}
	return p.Target
}

// toOperation presents a job as a google.longrunning.Operation. The job's
// Result is the protojson of a google.protobuf.Any (the response) and its
// Error the protojson of a google.rpc.Status; rows that cannot be decoded are
// reported as an INTERNAL error on the operation rather than failing the RPC.
func toOperation(j repository.Job) (*longrunningpb.Operation, error) {
	md := &clv1.OperationMetadata{
		Verb:                  j.Kind,
		Server:                j.ServerID,
		Step:                  j.Step,
		StepsDone:             j.StepsDone,
		StepsTotal:            j.StepsTotal,
		RequestedCancellation: j.CancelRequested,
		CreateTime:            timestamppb.New(j.CreateTime),
		Attempt:               j.Attempt,
	}
	if j.ResourceID != "" {
		md.Cluster = clusterName(j.ResourceID)
	}
	md.TargetWorkerNodeCount = targetWorkers(j)
	if j.EndTime != nil {
		md.EndTime = timestamppb.New(*j.EndTime)
	}
	mdAny, err := anypb.New(md)
	if err != nil {
		return nil, fmt.Errorf("operation %s metadata: %w", j.ID, err)
	}
	op := &longrunningpb.Operation{Name: operationName(j.ID), Metadata: mdAny, Done: j.Status.Done()}
	switch j.Status {
	case repository.JobInProgress:
	case repository.JobSucceeded:
		resp := &anypb.Any{}
		if j.Result == "" {
			resp, _ = anypb.New(&emptypb.Empty{})
		} else if err := protojson.Unmarshal([]byte(j.Result), resp); err != nil {
			op.Result = &longrunningpb.Operation_Error{Error: &spb.Status{Code: 13, Message: "stored result unreadable: " + err.Error()}}
			return op, nil
		}
		op.Result = &longrunningpb.Operation_Response{Response: resp}
	default:
		op.Result = &longrunningpb.Operation_Error{Error: jobError(j)}
	}
	return op, nil
}
