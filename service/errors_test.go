package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

func TestStatusMapsEveryDomainError(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("handler: %w", err) }
	tests := []struct {
		name        string
		err         error
		wantCode    codes.Code
		wantReason  string
		wantMessage string
	}{
		{"invalid argument", invalid("cluster.display_name", "must be a DNS label"), codes.InvalidArgument, "INVALID_ARGUMENT", "cluster.display_name: must be a DNS label"},
		{"held by another operation", wrap(&OperationInProgressError{Cluster: "clusters/a", Operation: "operations/b"}), codes.Aborted, "OPERATION_IN_PROGRESS", "please retry once it has finished"},
		{"refused transition", &InvalidTransitionError{Cluster: "clusters/a", State: lifecycle.Stopped, Event: lifecycle.AddNodeRequested}, codes.FailedPrecondition, "INVALID_STATE_TRANSITION", "cluster clusters/a is in state STOPPED, which does not allow ADD_NODE_REQUESTED"},
		{"machines changed under a recovery", wrap(&MachinesChangedError{Cluster: "a", Mismatch: "machine m1 is STOPPED"}), codes.FailedPrecondition, "MACHINES_CHANGED", "machines changed during recovery: machine m1 is STOPPED"},
		{"lost CAS", wrap(&repository.ConflictError{ClusterID: "a"}), codes.Aborted, "CONCURRENT_MODIFICATION", "please retry"},
		{"lost race", wrap(fmt.Errorf("%w: version moved", repository.ErrConflict)), codes.Aborted, "CONCURRENT_MODIFICATION", "please retry"},
		// A deadlock is retried by the repository; one that outlasts its
		// retries changed nothing and lost no race: UNAVAILABLE, not a conflict.
		{"deadlock past its retries", wrap(fmt.Errorf("gave up after 5 attempts: %w: mysql 1213", repository.ErrUnavailable)), codes.Unavailable, "DATABASE_UNAVAILABLE", "please retry"},
		{"not found", wrap(&NotFoundError{Name: "clusters/a"}), codes.NotFound, "NOT_FOUND", "clusters/a not found"},
		{"repository not found", wrap(repository.ErrNotFound), codes.NotFound, "NOT_FOUND", "not found"},
		{"name taken", wrap(repository.ErrAlreadyExists), codes.AlreadyExists, "ALREADY_EXISTS", "already exists"},
		{"quota exceeded", wrap(&repository.QuotaExceededError{Account: "acme", Violations: []repository.QuotaViolation{{Limit: "nodes", Max: 4, Usage: 3, Request: 2}}}),
			codes.ResourceExhausted, "QUOTA_EXCEEDED", "nodes limit 4, in use 3, requested 2"},
		{"database down", wrap(repository.ErrUnavailable), codes.Unavailable, "DATABASE_UNAVAILABLE", "please retry"},
		{"not implemented", &NotImplementedError{Method: "X", Detail: "later"}, codes.Unimplemented, "NOT_IMPLEMENTED", "X is not implemented yet"},
		{"client went away", wrap(context.Canceled), codes.Canceled, "CANCELLED", "cancelled"},
		{"deadline", wrap(context.DeadlineExceeded), codes.DeadlineExceeded, "DEADLINE_EXCEEDED", "deadline"},
		{"status from elsewhere", status.Error(codes.ResourceExhausted, "slow down"), codes.ResourceExhausted, "RESOURCE_EXHAUSTED", "slow down"},
		{"unknown error hides details", errors.New("pq: password=hunter2"), codes.Internal, "INTERNAL", "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := Status(tt.err)
			if st.Code() != tt.wantCode {
				t.Errorf("code = %v; want %v", st.Code(), tt.wantCode)
			}
			if !strings.Contains(st.Message(), tt.wantMessage) {
				t.Errorf("message = %q; want it to contain %q", st.Message(), tt.wantMessage)
			}
			var infos int
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					infos++
					if info.GetReason() != tt.wantReason || info.GetDomain() != Domain {
						t.Errorf("ErrorInfo = %v; want reason %s in %s", info, tt.wantReason, Domain)
					}
				}
			}
			if infos != 1 {
				t.Errorf("%d ErrorInfo details; want exactly 1", infos)
			}
		})
	}
}

func TestStatusOfInvalidArgumentListsEveryViolation(t *testing.T) {
	st := Status(&InvalidArgumentError{Violations: []FieldViolation{{"a", "bad"}, {"b", "worse"}}})
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			if len(br.GetFieldViolations()) != 2 || br.GetFieldViolations()[1].GetField() != "b" {
				t.Errorf("BadRequest = %v", br)
			}
			return
		}
	}
	t.Error("no BadRequest detail")
}

func TestOperationInProgressNamesTheHolder(t *testing.T) {
	st := Status(&OperationInProgressError{Cluster: "clusters/a", Operation: "operations/b"})
	if !strings.HasSuffix(st.Message(), "please retry once it has finished") || !strings.Contains(st.Message(), "operations/b") {
		t.Errorf("message = %q", st.Message())
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["operation"] != "operations/b" {
			t.Errorf("ErrorInfo metadata = %v; want the holding operation", info.GetMetadata())
		}
	}
}

func TestQuotaExceededCarriesAQuotaFailure(t *testing.T) {
	st := Status(fmt.Errorf("claim: %w", &repository.QuotaExceededError{Account: "acme", Violations: []repository.QuotaViolation{
		{Limit: "clusters", Max: 5, Usage: 5, Request: 1}, {Limit: "cpus", Max: 10, Usage: 8, Request: 4}}}))
	var (
		info *errdetails.ErrorInfo
		qf   *errdetails.QuotaFailure
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.QuotaFailure:
			qf = d
		}
	}
	if info.GetReason() != ReasonQuotaExceeded || info.GetMetadata()["account"] != "acme" || info.GetMetadata()["limits"] != "clusters,cpus" {
		t.Errorf("ErrorInfo = %v", info)
	}
	want := []string{"clusters limit 5: 5 in use, 1 requested", "cpus limit 10: 8 in use, 4 requested"}
	if len(qf.GetViolations()) != len(want) {
		t.Fatalf("QuotaFailure = %v; want %d violations", qf, len(want))
	}
	for i, v := range qf.GetViolations() {
		if v.GetSubject() != "accounts/acme" || v.GetDescription() != want[i] {
			t.Errorf("violation %d = %v; want accounts/acme, %q", i, v, want[i])
		}
	}
}
