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

// printCluster shows one cluster: in a table its fields and its nodes.
func (a *app) printCluster(c *clv1.Cluster) error {
	return a.show(view{msg: c, names: []string{c.GetName()}, table: func(wide bool) error { return a.clusterTable(c, wide) }})
}

func (a *app) clusterTable(c *clv1.Cluster, wide bool) error {
	w := a.table()
	row := func(k string, v any) { fmt.Fprintf(w, "%s:\t%v\n", k, v) }
	row("Name", c.GetName())
	row("Display name", c.GetDisplayName())
	row("Account", c.GetAccount())
	row("State", c.GetState())
	if msg := c.GetStatusMessage(); msg != "" {
		since := ""
		if c.GetStatusTime() != nil {
			since = " (since " + a.stampAge(c.GetStatusTime()) + ")"
		}
		row("Why", msg+since)
	}
	if next := c.GetNextStep(); next != "" {
		row("Next step", next)
	}
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
	row("Created", a.stampAge(c.GetCreateTime()))
	row("Updated", a.stampAge(c.GetUpdateTime()))
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
	if wide {
		fmt.Fprintln(w, "NODE\tMACHINE\tROLE\tPOWER\tJOINED\tKUBERNETES\tOFFERING")
	} else {
		fmt.Fprintln(w, "NODE\tMACHINE\tROLE\tPOWER\tJOINED\tKUBERNETES")
	}
	for _, n := range c.GetNodes() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%t\t%s", dash(n.GetDisplayName()), n.GetName(), n.GetRole(), n.GetPower(), n.GetJoined(), n.GetKubernetesVersion())
		if wide {
			offering := c.GetServiceOffering()
			if n.GetRole() == clv1.Node_CONTROL && c.GetControlOffering() != "" {
				offering = c.GetControlOffering()
			}
			if n.GetRole() == clv1.Node_EXTERNAL {
				offering = "-"
			}
			fmt.Fprintf(w, "\t%s", offering)
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

func (a *app) printClusters(resp *clv1.ListClustersResponse) error {
	names := make([]string, len(resp.GetClusters()))
	for i, c := range resp.GetClusters() {
		names[i] = c.GetName()
	}
	return a.show(view{msg: resp, list: true, names: names, table: func(wide bool) error {
		if len(resp.GetClusters()) == 0 {
			fmt.Fprintln(a.stdout, "No clusters.")
			return nil
		}
		w := a.table()
		head := "DISPLAY NAME\tNAME\tACCOUNT\tSTATE\tKUBERNETES\tNODES\tOPERATION\tAGE"
		if wide {
			head += "\tOFFERING\tAUTOSCALING\tENDPOINT\tCREATED\tWHY"
		}
		fmt.Fprintln(w, head)
		for _, c := range resp.GetClusters() {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d+%d\t%s\t%s", c.GetDisplayName(), c.GetName(), c.GetAccount(), c.GetState(),
				c.GetKubernetesVersion(), c.GetControlNodeCount(), c.GetWorkerNodeCount(), dash(c.GetCurrentOperation()), a.age(c.GetCreateTime()))
			if wide {
				offering := c.GetServiceOffering()
				if co := c.GetControlOffering(); co != "" && co != offering {
					offering = co + "/" + offering
				}
				auto := "-"
				if as := c.GetAutoscaling(); as.GetEnabled() {
					auto = fmt.Sprintf("%d-%d", as.GetMinSize(), as.GetMaxSize())
				}
				fmt.Fprintf(w, "\t%s\t%s\t%s\t%s\t%s", offering, auto, dash(c.GetEndpoint()), stamp(c.GetCreateTime()), dash(c.GetStatusMessage()))
			}
			fmt.Fprintln(w)
		}
		return w.Flush()
	}})
}

// printOperations shows one operation.
func (a *app) printOperations(op *longrunningpb.Operation) error {
	return a.show(view{msg: op, names: []string{op.GetName()}, table: func(wide bool) error {
		return a.operationTable([]*longrunningpb.Operation{op}, nil, wide)
	}})
}

// printOperationList shows operations as listed; displayNames names their
// clusters (clusters/{uuid} -> demo) where known.
func (a *app) printOperationList(resp *longrunningpb.ListOperationsResponse, displayNames map[string]string) error {
	names := make([]string, len(resp.GetOperations()))
	for i, op := range resp.GetOperations() {
		names[i] = op.GetName()
	}
	return a.show(view{msg: resp, list: true, names: names, table: func(wide bool) error {
		if len(resp.GetOperations()) == 0 {
			fmt.Fprintln(a.stdout, "No operations.")
			return nil
		}
		return a.operationTable(resp.GetOperations(), displayNames, wide)
	}})
}

// operationTable: one row per operation; how long ago it started and how
// long it ran (or has run so far), and the reason of a failure. One
// operation alone is followed by its whole error.
func (a *app) operationTable(ops []*longrunningpb.Operation, displayNames map[string]string, wide bool) error {
	w := a.table()
	head := "OPERATION\tVERB\tCLUSTER\tSTATUS\tSTEP\tPROGRESS\tAGE\tDURATION\tERROR"
	if wide {
		head += "\tCLUSTER NAME\tSERVER\tSTARTED\tENDED"
	}
	fmt.Fprintln(w, head)
	for _, op := range ops {
		md := verbOf(op)
		cluster := md.GetCluster()
		if d := displayNames[cluster]; d != "" {
			cluster = d
		} else if d := a.named[cluster]; d != "" {
			cluster = d
		}
		reason := "-"
		if op.GetError() != nil {
			if reason = reasonOf(status.FromProto(op.GetError())); reason == "" {
				reason = codes.Code(op.GetError().GetCode()).String()
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s", op.GetName(), md.GetVerb(), cluster, operationStatus(op),
			dash(md.GetStep()), md.GetStepsDone(), md.GetStepsTotal(), a.age(md.GetCreateTime()), a.duration(md), reason)
		if wide {
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s", md.GetCluster(), dash(md.GetServer()), stamp(md.GetCreateTime()), stamp(md.GetEndTime()))
		}
		fmt.Fprintln(w)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(ops) == 1 && ops[0].GetError() != nil {
		fmt.Fprintf(a.stdout, "\nError: %s\n", a.describe(nil, status.FromProto(ops[0].GetError()).Err()))
	}
	return nil
}

// duration is how long an operation ran, or has been running.
func (a *app) duration(md *clv1.OperationMetadata) string {
	if md.GetCreateTime() == nil {
		return "-"
	}
	end := a.now()
	if md.GetEndTime() != nil {
		end = md.GetEndTime().AsTime()
	}
	return shortDuration(end.Sub(md.GetCreateTime().AsTime()))
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
	return a.show(view{msg: resp, list: true, names: nil, table: func(wide bool) error {
		w := a.table()
		head := "TIME\tAGE\tEVENT\tFROM\tTO\tOPERATION\tSERVER\tMESSAGE"
		if !wide {
			head = "TIME\tEVENT\tFROM\tTO\tOPERATION\tSERVER\tMESSAGE"
		}
		fmt.Fprintln(w, head)
		for _, e := range resp.GetEvents() {
			from := e.GetFromState().String()
			if e.GetFromState() == clv1.Cluster_STATE_UNSPECIFIED {
				from = "-"
			}
			fmt.Fprint(w, stamp(e.GetTime()))
			if wide {
				fmt.Fprintf(w, "\t%s", a.age(e.GetTime()))
			}
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s\t%s\t%s\n", e.GetEvent(), from, e.GetToState(),
				dash(e.GetOperation()), dash(e.GetServer()), oneLine(e.GetMessage()))
		}
		return w.Flush()
	}})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stamp is a time in the local zone, saying which zone.
func stamp(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Local().Format(time.DateTime + ".000 MST")
}

// stampAge is a stamp and how long ago it was.
func (a *app) stampAge(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return stamp(t) + " (" + a.age(t) + " ago)"
}

// age is how long ago t was (kubectl's AGE), "-" if never.
func (a *app) age(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return age(a.now(), t.AsTime())
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

// printVersions shows versions as a list, or one version when one is
// given (what get, create and update return).
func (a *app) printVersions(resp *clv1.ListKubernetesVersionsResponse, one ...*clv1.KubernetesVersion) error {
	names := make([]string, 0, len(resp.GetKubernetesVersions()))
	for _, v := range resp.GetKubernetesVersions() {
		names = append(names, v.GetName())
	}
	var msg proto.Message = resp
	if len(one) == 1 {
		msg = one[0]
	}
	return a.show(view{msg: msg, list: len(one) == 0, names: names, table: func(wide bool) error {
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
	}})
}

// printOfferings shows offerings as a list, or one offering when one is
// given.
func (a *app) printOfferings(resp *clv1.ListServiceOfferingsResponse, one ...*clv1.ServiceOffering) error {
	names := make([]string, 0, len(resp.GetServiceOfferings()))
	for _, o := range resp.GetServiceOfferings() {
		names = append(names, o.GetName())
	}
	var msg proto.Message = resp
	if len(one) == 1 {
		msg = one[0]
	}
	return a.show(view{msg: msg, list: len(one) == 0, names: names, table: func(wide bool) error {
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
	}})
}
