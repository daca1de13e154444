package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// printJSON writes the protojson of a resource (the API's JSON, as REST
// answers it), one document per run. protojson varies its whitespace on
// purpose; encoding/json indents it the same way every time.
func (a *app) printJSON(m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %T as JSON: %w", m, err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return fmt.Errorf("indent %T: %w", m, err)
	}
	out.WriteByte('\n')
	_, err = a.stdout.Write(out.Bytes())
	return err
}

func (a *app) table() *tabwriter.Writer { return tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0) }

func (a *app) printCluster(c *clv1.Cluster) error {
	if a.output == "json" {
		return a.printJSON(c)
	}
	w := a.table()
	row := func(k string, v any) { fmt.Fprintf(w, "%s:\t%v\n", k, v) }
	row("Name", c.GetName())
	row("Display name", c.GetDisplayName())
	row("Account", c.GetAccount())
	row("State", c.GetState())
	row("Kubernetes", c.GetKubernetesVersion())
	if co := c.GetControlOffering(); co != "" && co != c.GetServiceOffering() {
		row("Nodes", fmt.Sprintf("%d control (%s) + %d workers (%s)", c.GetControlNodeCount(), co, c.GetWorkerNodeCount(), c.GetServiceOffering()))
	} else {
		row("Nodes", fmt.Sprintf("%d control + %d workers, %s", c.GetControlNodeCount(), c.GetWorkerNodeCount(), c.GetServiceOffering()))
	}
	if as := c.GetAutoscaling(); as.GetEnabled() {
		row("Autoscaling", fmt.Sprintf("%d to %d workers", as.GetMinSize(), as.GetMaxSize()))
	}
	row("Endpoint", dash(c.GetEndpoint()))
	row("Current operation", dash(c.GetCurrentOperation()))
	row("Etag", c.GetEtag())
	row("Created", stamp(c.GetCreateTime()))
	row("Updated", stamp(c.GetUpdateTime()))
	if d := c.GetDescription(); d != "" {
		row("Description", d)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(c.GetNodes()) == 0 {
		return nil
	}
	fmt.Fprintln(a.stdout)
	w = a.table()
	fmt.Fprintln(w, "NODE\tROLE\tPOWER\tJOINED\tKUBERNETES")
	for _, n := range c.GetNodes() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%t\t%s\n", n.GetName(), n.GetRole(), n.GetPower(), n.GetJoined(), n.GetKubernetesVersion())
	}
	return w.Flush()
}

func (a *app) printClusters(resp *clv1.ListClustersResponse) error {
	if a.output == "json" {
		return a.printJSON(resp)
	}
	if len(resp.GetClusters()) == 0 {
		fmt.Fprintln(a.stdout, "No clusters.")
		return nil
	}
	w := a.table()
	fmt.Fprintln(w, "DISPLAY NAME\tNAME\tACCOUNT\tSTATE\tKUBERNETES\tNODES\tOPERATION")
	for _, c := range resp.GetClusters() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d+%d\t%s\n", c.GetDisplayName(), c.GetName(), c.GetAccount(), c.GetState(),
			c.GetKubernetesVersion(), c.GetControlNodeCount(), c.GetWorkerNodeCount(), dash(c.GetCurrentOperation()))
	}
	return w.Flush()
}

// printOperations prints operations as a table, or one as JSON.
func (a *app) printOperations(op *longrunningpb.Operation) error {
	if a.output == "json" {
		return a.printJSON(op)
	}
	return a.operationTable([]*longrunningpb.Operation{op})
}

func (a *app) printOperationList(resp *longrunningpb.ListOperationsResponse) error {
	if a.output == "json" {
		return a.printJSON(resp)
	}
	if len(resp.GetOperations()) == 0 {
		fmt.Fprintln(a.stdout, "No operations.")
		return nil
	}
	return a.operationTable(resp.GetOperations())
}

func (a *app) operationTable(ops []*longrunningpb.Operation) error {
	w := a.table()
	fmt.Fprintln(w, "OPERATION\tVERB\tCLUSTER\tSTATUS\tSTEP\tPROGRESS\tSERVER\tSTARTED")
	for _, op := range ops {
		md := verbOf(op)
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", op.GetName(), md.GetVerb(), md.GetCluster(), operationStatus(op),
			dash(md.GetStep()), md.GetStepsDone(), md.GetStepsTotal(), dash(md.GetServer()), stamp(md.GetCreateTime()))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(ops) == 1 && ops[0].GetError() != nil {
		fmt.Fprintf(a.stdout, "\nError: %s\n", a.describe(nil, status.FromProto(ops[0].GetError()).Err()))
	}
	return nil
}

// operationStatus is how an operation stands: running, cancelling,
// succeeded, failed or cancelled.
func operationStatus(op *longrunningpb.Operation) string {
	switch {
	case !op.GetDone() && verbOf(op).GetRequestedCancellation():
		return "cancelling"
	case !op.GetDone():
		return "running"
	case op.GetError() == nil:
		return "succeeded"
	case codes.Code(op.GetError().GetCode()) == codes.Canceled:
		return "cancelled"
	}
	return "failed"
}

func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if r, ok := d.(interface{ GetReason() string }); ok {
			return r.GetReason()
		}
	}
	return ""
}

func (a *app) printEvents(resp *clv1.ListClusterEventsResponse) error {
	if a.output == "json" {
		return a.printJSON(resp)
	}
	w := a.table()
	fmt.Fprintln(w, "TIME\tEVENT\tFROM\tTO\tOPERATION\tSERVER\tMESSAGE")
	for _, e := range resp.GetEvents() {
		from := e.GetFromState().String()
		if e.GetFromState() == clv1.Cluster_STATE_UNSPECIFIED {
			from = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", stamp(e.GetTime()), e.GetEvent(), from, e.GetToState(),
			dash(e.GetOperation()), dash(e.GetServer()), oneLine(e.GetMessage()))
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stamp(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Local().Format(time.DateTime + ".000")
}

// oneLine keeps a table row on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// messageOf is an error's status message (or the error's text).
func messageOf(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// printVersions prints versions as a table; as JSON, the list, or one
// version when one is given (what get, create and update return).
func (a *app) printVersions(resp *clv1.ListKubernetesVersionsResponse, one ...*clv1.KubernetesVersion) error {
	if a.output == "json" {
		if len(one) == 1 {
			return a.printJSON(one[0])
		}
		return a.printJSON(resp)
	}
	if len(resp.GetKubernetesVersions()) == 0 {
		fmt.Fprintln(a.stdout, "No Kubernetes versions.")
		return nil
	}
	w := a.table()
	fmt.Fprintln(w, "VERSION\tSTATE\tMIN CPUS\tMIN MEMORY MB\tISO")
	for _, v := range resp.GetKubernetesVersions() {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", v.GetVersion(), v.GetState(), v.GetMinCpus(), v.GetMinMemoryMb(), dash(v.GetBinariesIso()))
	}
	return w.Flush()
}

// printOfferings prints offerings as a table; as JSON, the list, or one
// offering when one is given.
func (a *app) printOfferings(resp *clv1.ListServiceOfferingsResponse, one ...*clv1.ServiceOffering) error {
	if a.output == "json" {
		if len(one) == 1 {
			return a.printJSON(one[0])
		}
		return a.printJSON(resp)
	}
	if len(resp.GetServiceOfferings()) == 0 {
		fmt.Fprintln(a.stdout, "No service offerings.")
		return nil
	}
	w := a.table()
	fmt.Fprintln(w, "OFFERING\tSTATE\tCPUS\tMEMORY MB\tDESCRIPTION")
	for _, o := range resp.GetServiceOfferings() {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", strings.TrimPrefix(o.GetName(), "serviceOfferings/"), o.GetState(), o.GetCpus(), o.GetMemoryMb(), dash(oneLine(o.GetDescription())))
	}
	return w.Flush()
}
