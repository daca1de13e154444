package client

import (
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the google.rpc.ErrorInfo domain of every clusterd error.
const Domain = "clusterd.dev"

// The google.rpc.ErrorInfo reasons clusterd returns. They are stable: switch
// on them, not on messages.
const (
	// ReasonOperationInProgress (ABORTED): another operation holds the
	// cluster; retry once it has finished (RetryAborted does).
	ReasonOperationInProgress = "OPERATION_IN_PROGRESS"
	// ReasonConcurrentModification (ABORTED): a concurrent request changed the
	// cluster first; retry.
	ReasonConcurrentModification = "CONCURRENT_MODIFICATION"
	// ReasonEtagMismatch (ABORTED): the etag sent is stale; read the cluster
	// again before deciding. Never retried as is.
	ReasonEtagMismatch = "ETAG_MISMATCH"
	// ReasonInvalidStateTransition (FAILED_PRECONDITION): the cluster's state
	// does not allow the request.
	ReasonInvalidStateTransition = "INVALID_STATE_TRANSITION"
	// ReasonInvalidArgument (INVALID_ARGUMENT): see FieldViolations.
	ReasonInvalidArgument = "INVALID_ARGUMENT"
	// ReasonNotFound (NOT_FOUND).
	ReasonNotFound = "NOT_FOUND"
	// ReasonAlreadyExists (ALREADY_EXISTS): e.g. a display name taken in the account.
	ReasonAlreadyExists = "ALREADY_EXISTS"
	// ReasonDatabaseUnavailable, ReasonServerUnavailable, ReasonShuttingDown
	// (UNAVAILABLE): retry later, possibly on another server.
	ReasonDatabaseUnavailable = "DATABASE_UNAVAILABLE"
	ReasonServerUnavailable   = "SERVER_UNAVAILABLE"
	ReasonShuttingDown        = "SHUTTING_DOWN"
	// ReasonNotImplemented (UNIMPLEMENTED).
	ReasonNotImplemented = "NOT_IMPLEMENTED"
	// ReasonInternal (INTERNAL): a server bug; the server logged the cause.
	ReasonInternal = "INTERNAL"
	// ReasonKubeconfigUnavailable (FAILED_PRECONDITION): GetKubeconfig of a
	// cluster with no API endpoint yet, DESTROYED, or without credentials.
	ReasonKubeconfigUnavailable = "KUBECONFIG_UNAVAILABLE"
	// ReasonQuotaExceeded (RESOURCE_EXHAUSTED): the request would take the
	// account past a limit of its quota; see QuotaViolations. Retrying
	// helps only once the account holds less (or an admin raised it).
	ReasonQuotaExceeded = "QUOTA_EXCEEDED"
)

// CodeName spells c as google.rpc.Code does (CANCELLED, NOT_FOUND,
// DEADLINE_EXCEEDED; Go's codes.Canceled is CANCELLED there). It is also the
// ErrorInfo reason clusterd gives an error that has no reason of its own (a
// request the client cancelled, a status gRPC itself made), so the server
// and clusterctl spell codes in this one place. A code google.rpc.Code does
// not name is CODE_<number>.
func CodeName(c codes.Code) string {
	if name, ok := code.Code_name[int32(c)]; ok {
		return name
	}
	return "CODE_" + strconv.FormatUint(uint64(c), 10)
}

// Code is the gRPC code of err: codes.OK for nil, codes.Unknown for an error
// that carries no status. It reads RPC errors and *OperationError alike.
func Code(err error) codes.Code { return status.Code(err) }

// ErrorInfo returns the google.rpc.ErrorInfo err carries, or nil.
func ErrorInfo(err error) *errdetails.ErrorInfo {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// Reason is the ErrorInfo reason of err (e.g. ReasonOperationInProgress), or
// "" when err carries none.
func Reason(err error) string { return ErrorInfo(err).GetReason() }

// QuotaViolations lists the limits a RESOURCE_EXHAUSTED error's
// google.rpc.QuotaFailure names: each with its subject (accounts/{account})
// and a description of the limit, the usage and the request.
func QuotaViolations(err error) []*errdetails.QuotaFailure_Violation {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil
	}
	var out []*errdetails.QuotaFailure_Violation
	for _, d := range st.Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			out = append(out, qf.GetViolations()...)
		}
	}
	return out
}

// FieldViolations lists the invalid request fields of an INVALID_ARGUMENT
// error (its google.rpc.BadRequest), each with the field's path in the
// request (e.g. "cluster.display_name") and what is wrong with it.
func FieldViolations(err error) []*errdetails.BadRequest_FieldViolation {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil
	}
	var out []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			out = append(out, br.GetFieldViolations()...)
		}
	}
	return out
}
