package repository

import (
	"fmt"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
)

// Cluster is a cluster as stored: the lifecycle state with the version
// counter that every write bumps, the operation holding it, and its spec.
type Cluster struct {
	ID               string
	Account          string
	DisplayName      string
	Description      string
	State            lifecycle.State
	Version          int64
	CurrentOperation string
	Spec             Spec
	Endpoint         string
	CreateTime       time.Time
	UpdateTime       time.Time
	// DeleteTime is set once the cluster is DESTROYED.
	DeleteTime *time.Time
	// Status says why the cluster is not healthy (lifecycle.StatusOn):
	// written with the state, so it never describes another one.
	Status Status
}

// Status is a cluster's status message and when it was set: the history
// message of the write that moved the cluster into ALERT or ERROR. Zero
// when the cluster is healthy, or was never in trouble.
type Status struct {
	Message string
	Time    *time.Time
}

// Expect returns what a writer that read c conditions its next write on.
func (c Cluster) Expect() Expect {
	return Expect{State: c.State, Version: c.Version, Operation: c.CurrentOperation}
}

// Spec is the desired shape of a cluster, which operations change.
type Spec struct {
	KubernetesVersion string
	ControlNodeCount  int32
	WorkerNodeCount   int32
	// ServiceOffering is the workers' offering, and the control nodes'
	// unless ControlOffering names another.
	ServiceOffering string
	// ControlOffering is the control nodes' offering; empty means
	// ServiceOffering (see ControlOfferingOrDefault).
	ControlOffering string
	Autoscaling     Autoscaling
}

// ControlOfferingOrDefault is the offering the control nodes have.
func (sp Spec) ControlOfferingOrDefault() string {
	if sp.ControlOffering != "" {
		return sp.ControlOffering
	}
	return sp.ServiceOffering
}

// Autoscaling is the cluster autoscaler's settings.
type Autoscaling struct {
	Enabled bool
	MinSize int32
	MaxSize int32
}

// JobStatus is where a job is in its life. Only IN_PROGRESS jobs hold
// clusters; the others are history.
type JobStatus string

// Job statuses (SPEC §4).
const (
	JobInProgress JobStatus = "IN_PROGRESS"
	JobSucceeded  JobStatus = "SUCCEEDED"
	JobFailed     JobStatus = "FAILED"
	JobCancelled  JobStatus = "CANCELLED"
)

// Done reports whether the status is final.
func (s JobStatus) Done() bool { return s != JobInProgress }

// Job is one asynchronous operation: what it does, the cluster it acts on,
// the server that runs it, and how far it got.
type Job struct {
	ID   string
	Kind string
	// Account is the account of the cluster the job acts on; who may see
	// the operation. Empty only in rows of jobs without a cluster.
	Account string
	// ResourceID is the cluster the job acts on; empty in rows written by
	// servers that predate the column (SPEC §4, mixed versions).
	ResourceID        string
	ServerID          string
	ServerIncarnation string
	Status            JobStatus
	// RequestID is the client's idempotency key (AIP-155), empty if none;
	// unique per account.
	RequestID string
	// RequestHash fingerprints the request that started the job, so a
	// request id sent again with other parameters is refused, not replayed.
	// Empty in rows written before it existed.
	RequestHash string
	// Params, Result and Error are opaque to the repository (JSON written by
	// the service).
	Params          string
	Result          string
	Error           string
	Step            string
	StepsDone       int32
	StepsTotal      int32
	CancelRequested bool
	// Attempt counts the servers that have run the job: 1 for the server
	// that claimed it, one more for each adoption (SPEC §5 step 4). With the
	// job's id it is the fencing token of every infrastructure call and the
	// condition of every write the job makes, so a server whose job was
	// adopted is refused from that instant.
	Attempt int32
	// HandedOff is set when the job's server let go of it on a graceful stop
	// (at a step boundary): any live server may adopt it at once.
	HandedOff  bool
	Deadline   time.Time
	CreateTime time.Time
	UpdateTime time.Time
	EndTime    *time.Time
}

// Event is one entry of a cluster's history.
type Event struct {
	ID        int64
	ClusterID string
	Time      time.Time
	From      lifecycle.State
	// Name is the lifecycle event (e.g. SCALE_UP_REQUESTED), or a history-only
	// kind such as OPERATION_ENDED.
	Name      string
	To        lifecycle.State
	Operation string
	Server    string
	Message   string
}

// OperationEnded is the history entry of an operation that ends without a
// state change (SPEC §3.4): it only releases the cluster.
const OperationEnded = "OPERATION_ENDED"

// Server is one clusterd process as its peers see it.
type Server struct {
	ID            string
	Incarnation   string
	StartTime     time.Time
	HeartbeatTime time.Time
	// Host and PID say which process runs the incarnation (empty and 0 in
	// rows of servers that predate them, or that RegisterServer wrote).
	Host string
	PID  int64
}

// clusterRow, jobRow, eventRow and serverRow are the GORM mappings. They stay
// unexported so that no GORM type leaks out of this package.
type clusterRow struct {
	ID                 string `gorm:"primaryKey"`
	Account            string
	DisplayName        string
	Alive              *int
	Description        string
	State              string
	Version            int64
	CurrentOperation   string
	KubernetesVersion  string
	ControlNodeCount   int32
	WorkerNodeCount    int32
	ServiceOffering    string
	ControlOffering    string
	AutoscalingEnabled bool
	AutoscalingMin     int32
	AutoscalingMax     int32
	Endpoint           string
	CreateTime         time.Time
	UpdateTime         time.Time
	DeleteTime         *time.Time
	StatusMessage      string
	StatusTime         *time.Time
}

func (clusterRow) TableName() string { return "clusters" }

type jobRow struct {
	ID                string `gorm:"primaryKey"`
	Kind              string
	Account           string
	ResourceID        *string
	ServerID          string
	ServerIncarnation string
	Status            string
	RequestID         *string
	RequestHash       string
	Params            string
	Result            string
	Error             string
	Step              string
	StepsDone         int32
	StepsTotal        int32
	CancelRequested   bool
	Attempt           int32
	HandedOff         bool
	TargetVersion     *string
	TargetOffering    *string
	Deadline          time.Time
	CreateTime        time.Time
	UpdateTime        time.Time
	EndTime           *time.Time
}

func (jobRow) TableName() string { return "jobs" }

type eventRow struct {
	ID        int64 `gorm:"primaryKey;autoIncrement"`
	ClusterID string
	Time      time.Time
	FromState string
	Event     string
	ToState   string
	Operation string
	Server    string
	Message   string
}

func (eventRow) TableName() string { return "cluster_events" }

type serverRow struct {
	ID            string `gorm:"primaryKey"`
	Incarnation   string
	StartTime     time.Time
	HeartbeatTime time.Time
	Host          string
	PID           int64 `gorm:"column:pid"`
}

func (serverRow) TableName() string { return "servers" }

func (r *serverRow) toServer() Server {
	return Server{
		ID: r.ID, Incarnation: r.Incarnation, StartTime: r.StartTime.UTC(), HeartbeatTime: r.HeartbeatTime.UTC(),
		Host: r.Host, PID: r.PID,
	}
}

func (r *clusterRow) toCluster() (Cluster, error) {
	st, err := lifecycle.ParseState(r.State)
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: stored state: %w", r.ID, err)
	}
	return Cluster{
		ID:               r.ID,
		Account:          r.Account,
		DisplayName:      r.DisplayName,
		Description:      r.Description,
		State:            st,
		Version:          r.Version,
		CurrentOperation: r.CurrentOperation,
		Spec: Spec{
			KubernetesVersion: r.KubernetesVersion,
			ControlNodeCount:  r.ControlNodeCount,
			WorkerNodeCount:   r.WorkerNodeCount,
			ServiceOffering:   r.ServiceOffering,
			ControlOffering:   r.ControlOffering,
			Autoscaling: Autoscaling{
				Enabled: r.AutoscalingEnabled,
				MinSize: r.AutoscalingMin,
				MaxSize: r.AutoscalingMax,
			},
		},
		Endpoint:   r.Endpoint,
		CreateTime: r.CreateTime.UTC(),
		UpdateTime: r.UpdateTime.UTC(),
		DeleteTime: utcPtr(r.DeleteTime),
		Status:     Status{Message: r.StatusMessage, Time: utcPtr(r.StatusTime)},
	}, nil
}

func (r *jobRow) toJob() Job {
	return Job{
		ID:                r.ID,
		Kind:              r.Kind,
		Account:           r.Account,
		ResourceID:        deref(r.ResourceID),
		ServerID:          r.ServerID,
		ServerIncarnation: r.ServerIncarnation,
		Status:            JobStatus(r.Status),
		RequestID:         deref(r.RequestID),
		RequestHash:       r.RequestHash,
		Params:            r.Params,
		Result:            r.Result,
		Error:             r.Error,
		Step:              r.Step,
		StepsDone:         r.StepsDone,
		StepsTotal:        r.StepsTotal,
		CancelRequested:   r.CancelRequested,
		Attempt:           r.Attempt,
		HandedOff:         r.HandedOff,
		Deadline:          r.Deadline.UTC(),
		CreateTime:        r.CreateTime.UTC(),
		UpdateTime:        r.UpdateTime.UTC(),
		EndTime:           utcPtr(r.EndTime),
	}
}

func (r *eventRow) toEvent() Event {
	from, _ := lifecycle.ParseState(r.FromState)
	to, _ := lifecycle.ParseState(r.ToState)
	return Event{
		ID:        r.ID,
		ClusterID: r.ClusterID,
		Time:      r.Time.UTC(),
		From:      from,
		Name:      r.Event,
		To:        to,
		Operation: r.Operation,
		Server:    r.Server,
		Message:   r.Message,
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// nullable stores "" as NULL, so unique indexes ignore absent keys.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
