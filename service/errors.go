package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/protoadapt"

	"github.com/clusterd/clusterd/auth"
	"github.com/clusterd/clusterd/client"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// Domain is the google.rpc.ErrorInfo domain of every clusterd error.
const Domain = "clusterd.dev"

// Reasons are the stable google.rpc.ErrorInfo reasons clients switch on; the
// messages around them may change, these may not.
const (
	ReasonOperationInProgress    = "OPERATION_IN_PROGRESS"
	ReasonConcurrentModification = "CONCURRENT_MODIFICATION"
	ReasonInvalidStateTransition = "INVALID_STATE_TRANSITION"
	ReasonEtagMismatch           = "ETAG_MISMATCH"
	ReasonInvalidArgument        = "INVALID_ARGUMENT"
	ReasonNotFound               = "NOT_FOUND"
	ReasonAlreadyExists          = "ALREADY_EXISTS"
	ReasonDatabaseUnavailable    = "DATABASE_UNAVAILABLE"
	ReasonNotImplemented         = "NOT_IMPLEMENTED"
	ReasonInternal               = "INTERNAL"
	ReasonShuttingDown           = "SHUTTING_DOWN"
	ReasonServerUnavailable      = "SERVER_UNAVAILABLE"
	// ReasonCredentialsMissing: no token or client certificate
	// (UNAUTHENTICATED); ReasonCredentialsInvalid: an unknown or malformed
	// one; ReasonAdminRequired: a user called an admin-only service
	// (PERMISSION_DENIED).
	ReasonCredentialsMissing = "CREDENTIALS_MISSING"
	ReasonCredentialsInvalid = "CREDENTIALS_INVALID"
	ReasonAdminRequired      = "ADMIN_REQUIRED"
	// ReasonCredentialsRevoked: a reload of the token file removed the
	// credentials of a call in progress, which the server ended
	// (UNAUTHENTICATED).
	ReasonCredentialsRevoked = "CREDENTIALS_REVOKED"
	// ReasonMethodNotAllowed and ReasonRequestTooLarge are the REST
	// gateway's own refusals (HTTP 405 and 413).
	ReasonMethodNotAllowed = "METHOD_NOT_ALLOWED"
	ReasonRequestTooLarge  = "REQUEST_TOO_LARGE"
	// ReasonUnsupportedMediaType: a REST body sent as anything but JSON
	// (HTTP 415).
	ReasonUnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE"
	// ReasonCrossOrigin: a browser sent a REST call that changes something
	// from a page of another site (HTTP 403).
	ReasonCrossOrigin = "CROSS_ORIGIN_REQUEST"
	// ReasonCatalogEntryUnusable: a create, upgrade or scale needs a
	// Kubernetes version or service offering that does not exist or is
	// DISABLED (FAILED_PRECONDITION; metadata "resource").
	ReasonCatalogEntryUnusable = "CATALOG_ENTRY_UNUSABLE"
	// ReasonCatalogEntryInUse: a delete of a Kubernetes version or service
	// offering that a cluster uses (FAILED_PRECONDITION; metadata
	// "resource" and "cluster").
	ReasonCatalogEntryInUse = "CATALOG_ENTRY_IN_USE"
	// ReasonQuotaExceeded: the request would take the account past one of
	// its limits (RESOURCE_EXHAUSTED, with a google.rpc.QuotaFailure naming
	// each limit; metadata "account" and "limits").
	ReasonQuotaExceeded = "QUOTA_EXCEEDED"
	// ReasonWatchExpired: a watch's resume token is older than the change
	// feed's retention (FAILED_PRECONDITION): list and watch again.
	ReasonWatchExpired = "WATCH_EXPIRED"
	// ReasonWatchTooSlow: a watcher fell further behind than its buffer
	// (RESOURCE_EXHAUSTED, metadata "resume_token" to go on from).
	ReasonWatchTooSlow = "WATCH_TOO_SLOW"
	// ReasonWatchLimit: the account has as many watches open as a server
	// allows (RESOURCE_EXHAUSTED, metadata "limit").
	ReasonWatchLimit = "WATCH_LIMIT"
)

// Reasons of a failed or cancelled operation's error (Operation.error): why
// the operation ended without success, stable like the others.
const (
	// ReasonStepFailed: an infrastructure step failed (metadata "step").
	ReasonStepFailed = "STEP_FAILED"
	// ReasonCancelled: CancelOperation was honoured at a step (CANCELLED).
	ReasonCancelled = "CANCELLED"
	// ReasonDeadlineExceeded: the operation ran past its deadline.
	ReasonDeadlineExceeded = "DEADLINE_EXCEEDED"
	// ReasonServerStopped: the server running the operation shut down or
	// restarted mid-operation (UNAVAILABLE: send it again).
	ReasonServerStopped = "SERVER_STOPPED"
	// ReasonOwnerServerStopped: the server running the operation stopped
	// heartbeating; a peer ended it.
	ReasonOwnerServerStopped = "OWNER_SERVER_STOPPED"
	// ReasonLostClaim: the operation no longer held its cluster (another
	// operation or recovery took it, or its server lost its lease), so it
	// stopped without touching the cluster again.
	ReasonLostClaim = "LOST_CLAIM"
	// ReasonJobLost: the operation's own server lost track of it (its end
	// could not be recorded); the scanner ended it.
	ReasonJobLost = "JOB_LOST"
	// ReasonMachinesChanged: the scanner's recovery of an ALERT cluster
	// found its machines no longer all running, joined and at the recorded
	// version (FAILED_PRECONDITION: the cluster stays ALERT until they are).
	ReasonMachinesChanged = "MACHINES_CHANGED"
)

// StepError is an infrastructure step that failed, so the operation's error
// names the step (ErrorInfo metadata "step").
type StepError struct {
	Step string
	Err  error
}

// Error names the step, once: a driver's error that already starts with
// the step's name (the simulator's do) is not prefixed again.
func (e *StepError) Error() string {
	if msg := e.Err.Error(); strings.HasPrefix(msg, e.Step+": ") {
		return msg
	}
	return e.Step + ": " + e.Err.Error()
}

// Unwrap exposes the infrastructure's error (infra.ErrFenced, ...).
func (e *StepError) Unwrap() error { return e.Err }

// MachinesChangedError ends the recovery of an ALERT cluster whose machines
// changed between the scanner's look and the recovery's own (a machine
// stopped or left Kubernetes, a node changed version): the operation's error
// names what (Mismatch, as infra.Mismatch says it), not "internal error".
type MachinesChangedError struct {
	Cluster  string
	Mismatch string
}

// Error says what no longer matches.
func (e *MachinesChangedError) Error() string {
	return "machines changed during recovery: " + e.Mismatch
}

// maxCause bounds the text of an operation's cause as it is stored and
// shown (Operation.error.message, the failure's history entry): enough for
// any infrastructure error an operator needs to read whole, short of what a
// TEXT column or a terminal should take.
const maxCause = 2 * 1024

// boundCause is an operation's cause as it is stored and shown: whole up to
// maxCause bytes, otherwise cut there at a rune boundary and saying so
// (unlike Clip, which quotes a client's input, this is the server's own
// account of what went wrong). Invalid UTF-8 is replaced, since protojson
// refuses to encode it and the cause would be lost.
func boundCause(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxCause {
		return s
	}
	suffix := fmt.Sprintf("…(cut: %d bytes in all)", len(s))
	cut := maxCause - len(suffix)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + suffix
}

// EncodeJobError is the stored error of a job that did not succeed: the
// protojson of the google.rpc.Status that Status maps its cause to, with the
// same ErrorInfo an RPC error carries. The runner and the scanner store it;
// GetOperation and WaitOperation return it as the operation's error. Its
// message is bounded here (boundCause), the one place every operation's
// error passes through on its way to the database.
func EncodeJobError(cause error) string {
	st := Status(cause)
	if msg := st.Message(); len(msg) > maxCause || !utf8.ValidString(msg) {
		p := st.Proto()
		p.Message = boundCause(msg)
		st = status.FromProto(p)
	}
	if (st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded) &&
		!errors.Is(cause, runner.ErrCancelled) && !errors.Is(cause, runner.ErrDeadline) {
		// A job's work runs on no client's request: a context error there
		// is not a cancellation or deadline the client asked for.
		st = build(codes.Internal, "internal error", ReasonInternal, nil)
	}
	b, err := protojson.Marshal(st.Proto())
	if err != nil {
		b, _ = protojson.Marshal(&spb.Status{Code: int32(codes.Internal), Message: "internal error"})
	}
	return string(b)
}

// StatusWithReason builds a status for a refusal the server makes outside
// any handler (the REST gateway's routing), with its ErrorInfo.
func StatusWithReason(c codes.Code, msg, reason string) *status.Status {
	return build(c, msg, reason, nil)
}

// FieldViolation names one invalid request field, in the request's own
// field path (e.g. "cluster.display_name").
type FieldViolation struct {
	Field       string
	Description string
}

// InvalidArgumentError is a request that fails validation; it becomes
// INVALID_ARGUMENT with a google.rpc.BadRequest listing every violation, so a
// client can fix all fields at once.
type InvalidArgumentError struct {
	Violations []FieldViolation
}

// Error lists the violations.
func (e *InvalidArgumentError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Description
	}
	return "invalid argument: " + strings.Join(parts, "; ")
}

// invalid is shorthand for a single-field InvalidArgumentError.
func invalid(field, format string, args ...any) error {
	return &InvalidArgumentError{Violations: []FieldViolation{{Field: field, Description: fmt.Sprintf(format, args...)}}}
}

// OperationInProgressError refuses a request because another operation holds
// the cluster (SPEC §3.3).
type OperationInProgressError struct {
	Cluster   string
	Operation string
}

// Error names the holder and tells the client what to do.
func (e *OperationInProgressError) Error() string {
	return fmt.Sprintf("another operation is in progress on %s: %s; please retry once it has finished", e.Cluster, e.Operation)
}

// InvalidTransitionError refuses a request whose event the cluster's state
// does not allow while nothing holds the cluster (SPEC §3.3).
type InvalidTransitionError struct {
	Cluster string
	State   lifecycle.State
	Event   lifecycle.Event
	// Detail, when set, explains a refusal the transition table alone does
	// not make (a stopped cluster may scale its offering, not its size).
	Detail string
}

// Error is the SPEC's message.
func (e *InvalidTransitionError) Error() string {
	msg := fmt.Sprintf("cluster %s is in state %s, which does not allow %s", e.Cluster, e.State, e.Event)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// NotFoundError names the resource a request asked for that does not exist,
// in the client's own terms (its resource name), not the database's.
type NotFoundError struct {
	Name string
}

// Error names the missing resource.
func (e *NotFoundError) Error() string { return e.Name + " not found" }

// notFound replaces a repository ErrNotFound with the resource name the
// client used; other errors pass through.
func notFound(err error, name string) error {
	if errors.Is(err, repository.ErrNotFound) {
		return &NotFoundError{Name: name}
	}
	return err
}

// NotImplementedError answers an RPC whose behaviour has not landed yet,
// saying so plainly instead of pretending.
type NotImplementedError struct {
	Method string
	Detail string
}

// Error says what is missing.
func (e *NotImplementedError) Error() string {
	return fmt.Sprintf("%s is not implemented yet: %s", e.Method, e.Detail)
}

// Status maps any error a handler returns to the gRPC status the client
// sees, with a google.rpc.ErrorInfo in every one. It is the only place where
// domain errors become status codes; the server's interceptor calls it.
func Status(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	var (
		inval      *InvalidArgumentError
		inProgress *OperationInProgressError
		transition *InvalidTransitionError
		notImpl    *NotImplementedError
		missing    *NotFoundError
		stale      *EtagMismatchError
		reused     *RequestIDReusedError
		exists     *AlreadyExistsError
		conflict   *repository.ConflictError
		header     *auth.HeaderError
		unusable   *repository.UnusableError
		inUse      *repository.InUseError
		step       *StepError
		changed    *MachinesChangedError
		noKubecfg  *KubeconfigUnavailableError
		quota      *repository.QuotaExceededError
		slow       *WatchTooSlowError
		limit      *WatchLimitError
	)
	switch {
	// Why an operation ended without success (the job's stored error).
	case errors.Is(err, infra.ErrFenced), errors.Is(err, errNotHeld):
		return build(codes.Aborted, "the operation no longer held its cluster and stopped: "+err.Error(), ReasonLostClaim, nil)
	case errors.Is(err, runner.ErrLeaseLost):
		return build(codes.Unavailable, "the operation's server lost its lease (peers may recover its cluster); please retry", ReasonLostClaim, nil)
	case errors.Is(err, runner.ErrCancelled):
		return build(codes.Canceled, runner.ErrCancelled.Error(), ReasonCancelled, nil)
	case errors.Is(err, runner.ErrDeadline):
		return build(codes.DeadlineExceeded, runner.ErrDeadline.Error(), ReasonDeadlineExceeded, nil)
	case errors.Is(err, runner.ErrShutdown):
		return build(codes.Unavailable, runner.ErrShutdown.Error()+"; please retry", ReasonServerStopped, nil)
	case errors.Is(err, runner.ErrServerRestarted):
		return build(codes.Unavailable, runner.ErrServerRestarted.Error()+" mid-operation; please retry", ReasonServerStopped, nil)
	case errors.Is(err, runner.ErrOwnerStopped):
		return build(codes.Unavailable, runner.ErrOwnerStopped.Error()+" mid-operation; please retry", ReasonOwnerServerStopped, nil)
	case errors.Is(err, runner.ErrJobLost):
		return build(codes.Unavailable, "the operation ended: "+runner.ErrJobLost.Error()+"; please retry", ReasonJobLost, nil)
	case errors.As(err, &step) && !errors.Is(err, repository.ErrUnavailable):
		return build(codes.Unavailable, fmt.Sprintf("step %s failed: %s", step.Step, step.Err.Error()), ReasonStepFailed,
			map[string]string{"step": step.Step})
	case errors.As(err, &changed):
		return build(codes.FailedPrecondition, changed.Error(), ReasonMachinesChanged,
			map[string]string{"cluster": "clusters/" + changed.Cluster})
	// Errors of requests.
	case errors.As(err, &noKubecfg):
		return build(codes.FailedPrecondition, noKubecfg.Error(), ReasonKubeconfigUnavailable, nil)
	case errors.Is(err, auth.ErrRevoked):
		return build(codes.Unauthenticated, err.Error(), ReasonCredentialsRevoked, nil)
	case errors.Is(err, auth.ErrNoCredentials):
		return build(codes.Unauthenticated, err.Error(), ReasonCredentialsMissing, nil)
	case errors.Is(err, auth.ErrBadCredentials):
		return build(codes.Unauthenticated, err.Error(), ReasonCredentialsInvalid, nil)
	case errors.Is(err, auth.ErrAdminOnly):
		return build(codes.PermissionDenied, err.Error(), ReasonAdminRequired, nil)
	case errors.As(err, &header):
		return Status(&InvalidArgumentError{Violations: []FieldViolation{{Field: header.Header, Description: header.Detail}}})
	case errors.As(err, &inval):
		br := &errdetails.BadRequest{}
		for _, v := range inval.Violations {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
		}
		return build(codes.InvalidArgument, inval.Error(), ReasonInvalidArgument, nil, br)
	case errors.As(err, &inProgress):
		return build(codes.Aborted, inProgress.Error(), ReasonOperationInProgress,
			map[string]string{"cluster": inProgress.Cluster, "operation": inProgress.Operation})
	case errors.As(err, &transition):
		return build(codes.FailedPrecondition, transition.Error(), ReasonInvalidStateTransition,
			map[string]string{"cluster": transition.Cluster, "state": transition.State.String(), "event": transition.Event.String()})
	case errors.As(err, &notImpl):
		return build(codes.Unimplemented, notImpl.Error(), ReasonNotImplemented, map[string]string{"method": notImpl.Method})
	case errors.As(err, &stale):
		return build(codes.Aborted, stale.Error(), ReasonEtagMismatch, map[string]string{"cluster": stale.Cluster, "etag": stale.Current})
	case errors.As(err, &reused):
		return build(codes.InvalidArgument, reused.Error(), ReasonInvalidArgument, map[string]string{"operation": reused.Operation},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "request_id", Description: reused.Error()}}})
	case errors.As(err, &exists):
		return build(codes.AlreadyExists, exists.Error(), ReasonAlreadyExists, nil)
	case errors.As(err, &quota):
		return quotaStatus(quota)
	case errors.Is(err, errWatchExpired):
		return build(codes.FailedPrecondition, "the resume token is older than the watch history kept; list the clusters and watch again without a token",
			ReasonWatchExpired, nil)
	case errors.As(err, &slow):
		return build(codes.ResourceExhausted, "the watch fell too far behind and was ended; watch again with the resume token",
			ReasonWatchTooSlow, map[string]string{"resume_token": slow.Token})
	case errors.As(err, &limit):
		return build(codes.ResourceExhausted, limit.Error(), ReasonWatchLimit, map[string]string{"limit": strconv.Itoa(limit.Limit)})
	case errors.Is(err, errNoLease):
		return build(codes.Unavailable, errNoLease.Error()+"; please retry", ReasonServerUnavailable, nil)
	case errors.Is(err, errShuttingDown):
		return build(codes.Unavailable, "the server is shutting down; please retry", ReasonShuttingDown, nil)
	case errors.As(err, &missing):
		return build(codes.NotFound, missing.Error(), ReasonNotFound, map[string]string{"resource": missing.Name})
	case errors.As(err, &unusable):
		return build(codes.FailedPrecondition, unusable.Error(), ReasonCatalogEntryUnusable,
			map[string]string{"resource": catalogName(unusable.Kind, unusable.Name)})
	case errors.As(err, &inUse):
		return build(codes.FailedPrecondition, inUse.Error()+"; delete or move the cluster first, or disable the entry instead", ReasonCatalogEntryInUse,
			map[string]string{"resource": catalogName(inUse.Kind, inUse.Name), "cluster": clusterName(inUse.ClusterID)})
	case errors.As(err, &conflict):
		return build(codes.Aborted, fmt.Sprintf("cluster %s was changed by a concurrent request; please retry", conflict.ClusterID),
			ReasonConcurrentModification, map[string]string{"cluster": "clusters/" + conflict.ClusterID})
	case errors.Is(err, repository.ErrConflict):
		return build(codes.Aborted, "the resource was changed by a concurrent request; please retry", ReasonConcurrentModification, nil)
	case errors.Is(err, repository.ErrNotFound):
		return build(codes.NotFound, err.Error(), ReasonNotFound, nil)
	case errors.Is(err, repository.ErrAlreadyExists):
		return build(codes.AlreadyExists, err.Error(), ReasonAlreadyExists, nil)
	case errors.Is(err, repository.ErrUnavailable):
		return build(codes.Unavailable, "the database is unavailable; please retry", ReasonDatabaseUnavailable, nil)
	case errors.Is(err, context.Canceled):
		return build(codes.Canceled, "request cancelled", codeReason(codes.Canceled), nil)
	case errors.Is(err, context.DeadlineExceeded):
		return build(codes.DeadlineExceeded, "request deadline exceeded", codeReason(codes.DeadlineExceeded), nil)
	}
	if st, ok := status.FromError(err); ok {
		return withErrorInfo(st)
	}
	return build(codes.Internal, "internal error", ReasonInternal, nil)
}

// withErrorInfo adds an ErrorInfo to a status made elsewhere (gRPC itself, a
// library) so that every error a client sees carries a reason.
func withErrorInfo(st *status.Status) *status.Status {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return st
		}
	}
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: codeReason(st.Code()), Domain: Domain})
	if err != nil {
		return st
	}
	return withInfo
}

// codeReason is the reason of an error that has none of its own: its code
// as google.rpc.Code spells it (client.CodeName, which clusterctl prints).
func codeReason(c codes.Code) string { return client.CodeName(c) }

// quotaStatus is RESOURCE_EXHAUSTED with a google.rpc.QuotaFailure: one
// violation per limit exceeded, its subject the account, its description the
// limit, the usage and the request.
func quotaStatus(e *repository.QuotaExceededError) *status.Status {
	qf := &errdetails.QuotaFailure{}
	names := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		names[i] = v.Limit
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     "accounts/" + e.Account,
			Description: fmt.Sprintf("%s limit %d: %d in use, %d requested", v.Limit, v.Max, v.Usage, v.Request),
		})
	}
	return build(codes.ResourceExhausted, e.Error(), ReasonQuotaExceeded,
		map[string]string{"account": e.Account, "limits": strings.Join(names, ",")}, qf)
}

func build(c codes.Code, msg, reason string, meta map[string]string, extra ...protoadapt.MessageV1) *status.Status {
	st := status.New(c, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta}}
	details = append(details, extra...)
	with, err := st.WithDetails(details...)
	if err != nil {
		return st
	}
	return with
}
