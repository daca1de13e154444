package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// Operation kinds (the job's kind and OperationMetadata.verb).
const (
	VerbCreate      = "create"
	VerbStart       = "start"
	VerbStop        = "stop"
	VerbScale       = "scale"
	VerbUpgrade     = "upgrade"
	VerbAddNodes    = "add_nodes"
	VerbRemoveNodes = "remove_nodes"
	VerbDelete      = "delete"
	// VerbRecover is the scanner's: it takes over an orphaned operation, or
	// brings an ALERT cluster back (RECOVERING).
	VerbRecover = "recover"
)

// Verbs lists every operation kind a client can start.
func Verbs() []string {
	return []string{VerbCreate, VerbStart, VerbStop, VerbScale, VerbUpgrade, VerbAddNodes, VerbRemoveNodes, VerbDelete, VerbRecover}
}

// EtagMismatchError refuses a request made against a version of the cluster
// that is no longer current (AIP-154).
type EtagMismatchError struct {
	Cluster string
	Sent    string
	Current string
}

// Error says which etag is current.
func (e *EtagMismatchError) Error() string {
	return fmt.Sprintf("cluster %s has changed since etag %q (current etag %q); read it again and retry", e.Cluster, Clip(e.Sent), e.Current)
}

// RequestIDReusedError refuses a request_id that an earlier, different
// request already used (AIP-155 keys identify one request).
type RequestIDReusedError struct {
	RequestID string
	Operation string
}

// Error names the earlier operation.
func (e *RequestIDReusedError) Error() string {
	return fmt.Sprintf("request_id %s was already used by %s for a different request", e.RequestID, e.Operation)
}

// request is one mutating RPC on an existing cluster, reduced to what the
// shared claim path needs.
type request struct {
	// msg is the RPC's request, fingerprinted so that a request_id sent
	// again with other parameters is refused (AIP-155).
	msg       proto.Message
	name      string // clusters/{uuid}
	requestID string
	etag      string
	verb      string
	// event is the state machine event the request sends; eventFor, when
	// set, picks it from the cluster as read (a scale up or down).
	event    lifecycle.Event
	eventFor func(c repository.Cluster) lifecycle.Event
	// params are stored on the job (JSON) so an interrupted operation can
	// be understood and rerun; paramsFor, when set, builds them from the
	// cluster as read (the worker count a scale leads to).
	params    any
	paramsFor func(c repository.Cluster) any
	// check validates the request against the cluster as read, after the
	// holder and state checks (e.g. an offering smaller than the current
	// one). It must not change anything.
	check func(ctx context.Context, c repository.Cluster) error
	// work runs the operation's steps once the claim has committed; first,
	// when set, names the step it starts with (see firstStep).
	work  workFunc
	first firstStep
	// uses are the catalog entries the claim takes in its transaction (an
	// upgrade's target version); usesFor, when set, picks them from the
	// cluster as read (a scale's offering, only when it changes).
	uses    repository.Uses
	usesFor func(c repository.Cluster) repository.Uses
	// hold, when set, is what the operation grows the cluster as read to
	// (nil if it does not grow it): the claim records it and is held to
	// the account's quota (see the repository's package doc, "Quotas").
	hold func(c repository.Cluster) *repository.Hold
}

// idempotency is what identifies one client request across retries
// (AIP-155): its request id, unique within the account of the cluster it
// acts on, and the fingerprint of its parameters. The zero value (no
// request id) makes every request new.
type idempotency struct {
	account   string
	requestID string
	hash      string
}

// replay returns the operation an earlier request with the same request_id
// started, so a retried request never starts a second job. found is false
// when the id is new; the id used by a different request is refused.
func (s *Clusters) replay(ctx context.Context, key idempotency, verb, clusterID string) (*longrunningpb.Operation, bool, error) {
	if key.requestID == "" {
		return nil, false, nil
	}
	j, err := s.store.GetJobByRequestID(ctx, key.account, key.requestID)
	if errors.Is(err, repository.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if j.Kind != verb || (clusterID != "" && j.ResourceID != clusterID) || (j.RequestHash != "" && j.RequestHash != key.hash) {
		return nil, true, &RequestIDReusedError{RequestID: key.requestID, Operation: operationName(j.ID)}
	}
	op, err := toOperation(j)
	return op, true, err
}

// maxEtagLen bounds an etag; the ones this service issues are version
// numbers. Any shorter etag that is not current is a mismatch (ABORTED).
const maxEtagLen = 64

// checkEtag refuses an etag longer than any this service issues.
func checkEtag(e string) error {
	if len(e) > maxEtagLen {
		return invalid("etag", "must be at most %d bytes, got %d", maxEtagLen, len(e))
	}
	return nil
}

// admit applies SPEC §3.3 to a cluster as read: a stale etag, then another
// operation holding the cluster (ABORTED), then a state with no transition
// for the event (FAILED_PRECONDITION). It changes nothing, and returns the
// state machine's decision, which the claim carries out as is.
func admit(c repository.Cluster, etagSent string, ev lifecycle.Event) (lifecycle.Decision, error) {
	name := clusterName(c.ID)
	if etagSent != "" && etagSent != etag(c) {
		return lifecycle.Decision{}, &EtagMismatchError{Cluster: name, Sent: etagSent, Current: etag(c)}
	}
	if c.CurrentOperation != "" {
		return lifecycle.Decision{}, &OperationInProgressError{Cluster: name, Operation: operationName(c.CurrentOperation)}
	}
	d, err := lifecycle.Decide(c.State, ev)
	if err != nil {
		return lifecycle.Decision{}, &InvalidTransitionError{Cluster: name, State: c.State, Event: ev}
	}
	return d, nil
}

// run is the shared path of every mutating RPC on an existing cluster:
// validate the name, request id and etag, read the cluster (NOT_FOUND if the
// caller may not see it), refuse per SPEC §3.3, claim (CAS + job row in one
// transaction), and only then start the work. A refused request changes
// nothing.
//
// A request id (AIP-155) is looked up only when the request cannot go
// ahead: a retried request finds the cluster held by its first copy, or
// moved on, or, if the cluster would take it again, its claim's job row
// refused by the unique (account, request id) key, and is then answered
// with the first copy's operation. So a first request costs no lookup.
func (s *Clusters) run(ctx context.Context, r request) (*longrunningpb.Operation, error) {
	who, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	id, err := parseName("name", r.name, clusterPrefix)
	if err != nil {
		return nil, err
	}
	requestID, err := canonicalRequestID(r.requestID)
	if err != nil {
		return nil, err
	}
	if err := checkEtag(r.etag); err != nil {
		return nil, err
	}
	c, err := s.store.GetCluster(ctx, id)
	if err != nil {
		return nil, notFound(err, r.name)
	}
	if err := visible(who, c.Account, r.name); err != nil {
		return nil, err
	}
	key := idempotency{account: c.Account, requestID: requestID, hash: requestHash(r.msg)}
	op, err := s.admitAndClaim(ctx, c, key, r)
	if err != nil && key.requestID != "" {
		// An earlier copy of this request (same request_id) may have
		// claimed the cluster: answer with its operation, as AIP-155 asks.
		if op, found, rerr := s.replay(ctx, key, r.verb, id); found || rerr != nil {
			return op, rerr
		}
	}
	return op, err
}

// admitAndClaim refuses per SPEC §3.3, checks the request against the
// cluster as read, then claims it and starts the work.
func (s *Clusters) admitAndClaim(ctx context.Context, c repository.Cluster, key idempotency, r request) (*longrunningpb.Operation, error) {
	ev := r.event
	if r.eventFor != nil {
		ev = r.eventFor(c)
	}
	d, err := admit(c, r.etag, ev)
	if err != nil {
		return nil, err
	}
	if r.check != nil {
		if err := r.check(ctx, c); err != nil {
			return nil, err
		}
	}
	t := repository.Move(c, d)
	t.Message = fmt.Sprintf("%s requested", r.verb)
	t.Uses = r.uses
	if r.usesFor != nil {
		t.Uses = r.usesFor(c)
	}
	if r.hold != nil {
		if h := r.hold(c); h != nil {
			t.Changes.Hold = h
			t.Quota = s.quotaCheck()
		}
	}
	params := r.params
	if r.paramsFor != nil {
		params = r.paramsFor(c)
	}
	var starts repository.Progress
	if r.first != nil {
		starts = r.first(c)
	}
	return s.claim(ctx, t, r.verb, key, params, r.work, starts)
}

// firstStep is the step an operation on cluster c (as claimed) starts with,
// and the steps it expects then, when the cluster tells them (the zero
// Progress when it does not). The claim records them with the job, so the
// job's first step reads its row instead of writing it: one transaction
// less an operation. A guess the work's own reads prove wrong costs nothing
// but that saving: the first step then records what it does, as it would
// have anyway.
type firstStep func(c repository.Cluster) repository.Progress

// onEachMachine is the first step of an operation that begins with step on
// each of the cluster's machines (one for each node of its spec) and takes
// more steps after them.
func onEachMachine(step string, more int32) firstStep {
	return func(c repository.Cluster) repository.Progress {
		n := c.Spec.ControlNodeCount + c.Spec.WorkerNodeCount
		if n <= 0 {
			return repository.Progress{}
		}
		return repository.Progress{Step: step, StepsTotal: n + more}
	}
}

// claim writes the claim (the CAS, the job row and the history entry in one
// transaction) and only then starts the work. starts is the job's progress
// as the claim writes it (see firstStep).
func (s *Clusters) claim(ctx context.Context, t repository.Transition, verb string, key idempotency, params any, work workFunc, starts repository.Progress) (*longrunningpb.Operation, error) {
	if err := s.mayClaim(); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("encode %s parameters: %w", verb, err)
	}
	nj := s.newJob(verb, key, string(raw))
	nj.Step, nj.StepsTotal = starts.Step, starts.StepsTotal
	release, err := s.runner.Reserve(nj.ID)
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", verb, err)
	}
	defer release()
	c, job, err := s.store.Claim(ctx, t, nj)
	if err != nil {
		return nil, err
	}
	return s.launch(ctx, c, job, work)
}

// mayClaim refuses new work while this server is stopping, or has no lease
// (SPEC §5: a server that cannot heartbeat stops claiming until it can
// again).
func (s *Clusters) mayClaim() error {
	if s.draining.Load() {
		return errShuttingDown
	}
	if s.lease == nil {
		return nil
	}
	if err := s.lease.Check(); err != nil {
		return fmt.Errorf("%w: %w", errNoLease, err)
	}
	return nil
}

// errNoLease maps to UNAVAILABLE: another server can take the request.
var errNoLease = errors.New("this server cannot reach the database reliably and takes no new work")

// newJob describes the job a claim inserts.
func (s *Clusters) newJob(verb string, key idempotency, params string) repository.NewJob {
	return repository.NewJob{
		// A UUIDv7 (ids sort by creation), chosen here so that the runner
		// can reserve it before the claim commits.
		ID:                uuid.Must(uuid.NewV7()).String(),
		Kind:              verb,
		ServerID:          s.serverID,
		ServerIncarnation: s.incarnation,
		RequestID:         key.requestID,
		RequestHash:       key.hash,
		Params:            params,
		Deadline:          s.now().Add(s.deadlines.For(verb)),
	}
}
