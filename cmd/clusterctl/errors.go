package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"

	"github.com/clusterd/clusterd/client"
	"github.com/clusterd/clusterd/lifecycle"
)

// describe is the one place that turns an error into what clusterctl says
// about it: one line, in the words of the command line (flag names, not the
// API's field paths; the cluster as the user named it; what a verb needs,
// not the state machine's event names), with the ErrorInfo reason once at
// the end, in parentheses, unless the words already say it.
func (a *app) describe(cmd *cobra.Command, err error) string {
	var opErr *client.OperationError
	prefix := ""
	if errors.As(err, &opErr) {
		prefix = opErr.Name + " failed: "
		if client.Code(err) == codes.Canceled {
			prefix = opErr.Name + ": "
		}
	}
	reason := client.Reason(err)
	if reason == "" {
		reason = client.CodeName(client.Code(err))
	}
	var text string
	switch {
	case len(client.FieldViolations(err)) > 0:
		flags := fieldFlags(cmd)
		var parts []string
		for _, v := range client.FieldViolations(err) {
			parts = append(parts, flags.field(v.GetField())+": "+flags.words(v.GetDescription()))
		}
		text = "invalid argument: " + strings.Join(parts, "; ")
	case len(client.QuotaViolations(err)) > 0:
		var parts []string
		for _, v := range client.QuotaViolations(err) {
			parts = append(parts, v.GetSubject()+": "+v.GetDescription())
		}
		text = "quota exceeded: " + strings.Join(parts, "; ")
	case reason == client.ReasonInvalidStateTransition:
		text = transitionText(client.ErrorInfo(err).GetMetadata(), messageOf(err))
	case client.Code(err) == codes.Unavailable && client.ErrorInfo(err) == nil:
		text = a.unreachable(messageOf(err))
	case client.Code(err) == codes.DeadlineExceeded && client.ErrorInfo(err) == nil:
		text = fmt.Sprintf("no answer from %s within --timeout %s; a longer --timeout waits longer", a.server, a.timeout.String())
		reason = ""
	default:
		text = messageOf(err)
	}
	text = oneLine(prefix + a.ownNames(text))
	if reason != "" && !strings.Contains(strings.ToLower(text), strings.ToLower(strings.ReplaceAll(reason, "_", " "))) {
		text += " (" + reason + ")"
	}
	return text
}

// ownNames writes the clusters this run named in the user's own words
// ("demo") where the server's message has their resource names.
func (a *app) ownNames(text string) string {
	for _, name := range sortedKeys(a.named) {
		if arg := a.named[name]; name != arg {
			text = strings.ReplaceAll(text, name, arg)
		}
	}
	return text
}

// unreachable explains a transport failure (gRPC's own UNAVAILABLE, no
// ErrorInfo): which server, and the likely fix, for the symptoms of a
// refused connection and of plaintext and TLS talking past each other.
func (a *app) unreachable(msg string) string {
	switch low := strings.ToLower(msg); {
	case strings.Contains(low, "first record does not look like a tls handshake"):
		return fmt.Sprintf("%s does not speak TLS: %s; drop --tls (and the other --tls-* flags), or use an http:// or grpc:// --server", a.server, msg)
	case strings.Contains(low, "server preface") || strings.Contains(low, "frame too large") ||
		strings.Contains(low, "connection reset") || (strings.Contains(low, "eof") && !a.secure()):
		return fmt.Sprintf("%s closed a plaintext connection: %s; is it serving TLS? add --tls (or --tls-ca), or use an https:// --server", a.server, msg)
	case strings.Contains(low, "certificate") || strings.Contains(low, "x509") || strings.Contains(low, "tls:"):
		return fmt.Sprintf("TLS with %s failed: %s; check --tls-ca and --tls-server-name", a.server, msg)
	}
	return fmt.Sprintf("cannot reach clusterd at %s: %s; is it serving gRPC there? set --server or CLUSTERCTL_SERVER", a.server, msg)
}

// eventVerbs names the state machine's request events as the command that
// sends them, so no internal event name reaches the user.
var eventVerbs = map[string]string{
	lifecycle.StartRequested.String():      "start",
	lifecycle.StopRequested.String():       "stop",
	lifecycle.DestroyRequested.String():    "delete",
	lifecycle.RecoveryRequested.String():   "recovery",
	lifecycle.AutoscaleRequested.String():  "an autoscaler change",
	lifecycle.ScaleUpRequested.String():    "scaling up",
	lifecycle.ScaleDownRequested.String():  "scaling down",
	lifecycle.AddNodeRequested.String():    "add-nodes",
	lifecycle.RemoveNodeRequested.String(): "remove-nodes",
	lifecycle.UpgradeRequested.String():    "upgrade",
}

// transitionText says why a cluster's state refused a request: "cluster
// demo is STOPPED; upgrade needs RUNNING", the states that allow it asked of
// the state machine, and the server's own explanation when it gave one.
func transitionText(md map[string]string, msg string) string {
	state, err := lifecycle.ParseState(md["state"])
	if err != nil {
		return msg
	}
	event, err := lifecycle.ParseEvent(md["event"])
	if err != nil {
		return msg
	}
	verb := eventVerbs[event.String()]
	if verb == "" {
		verb = "this request"
	}
	text := fmt.Sprintf("cluster %s is %s; %s needs %s", md["cluster"], state, verb, orList(admitting(event)))
	// The server's explanation beyond the table ("cluster X is in state S,
	// which does not allow E: DETAIL").
	if _, detail, ok := strings.Cut(msg, event.String()+": "); ok {
		text = fmt.Sprintf("cluster %s is %s: %s", md["cluster"], state, detail)
	}
	return text
}

// admitting lists the states in which the state machine admits event.
func admitting(event lifecycle.Event) []string {
	var out []string
	for _, s := range lifecycle.States() {
		if _, err := lifecycle.Admit(s, event); err == nil {
			out = append(out, s.String())
		}
	}
	return out
}

// goal is the state a request event leads to once its operation succeeds
// (start: RUNNING, stop: STOPPED), asked of the state machine; ok is false
// when no state admits it.
func goal(event lifecycle.Event) (lifecycle.State, bool) {
	for _, s := range lifecycle.States() {
		if through, err := lifecycle.Next(s, event); err == nil {
			if to, err := lifecycle.Next(through, lifecycle.OperationSucceeded); err == nil {
				return to, true
			}
		}
	}
	return lifecycle.StateUnspecified, false
}

// alreadyThere reports whether err refused event because the cluster is
// already where the event leads (a start of a RUNNING cluster), and names
// the state.
func alreadyThere(err error, event lifecycle.Event) (string, bool) {
	if client.Reason(err) != client.ReasonInvalidStateTransition {
		return "", false
	}
	md := client.ErrorInfo(err).GetMetadata()
	want, ok := goal(event)
	if !ok || md["event"] != event.String() || md["state"] != want.String() {
		return "", false
	}
	return md["state"], true
}

// orList joins words as "A, B or C".
func orList(words []string) string {
	switch len(words) {
	case 0:
		return "a state no cluster is in"
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// flagNames maps the API's field paths (google.rpc.BadRequest) to the
// command line's words for one command.
type flagNames map[string]string

// fieldFlags is the map of cmd: its own fields, then those every mutation
// shares.
func fieldFlags(cmd *cobra.Command) flagNames {
	out := flagNames{"request_id": "--request-id", "etag": "--etag", "page_token": "--page-token", "filter": "--filter"}
	path := ""
	if cmd != nil {
		path = strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	}
	for k, v := range commandFields[path] {
		out[k] = v
	}
	return out
}

// commandFields are the field paths each command's flags and arguments set.
var commandFields = map[string]flagNames{
	"create": {
		"cluster": "the cluster", "cluster.display_name": "NAME", "cluster.description": "--description",
		"cluster.worker_node_count": "--workers", "worker_node_count": "--workers",
		"cluster.control_node_count": "--control-nodes",
		"cluster.kubernetes_version": "--kubernetes-version", "kubernetes_version": "--kubernetes-version",
		"cluster.service_offering": "--offering", "service_offering": "--offering",
		"cluster.control_offering": "--control-offering", "control_offering": "--control-offering",
		"cluster.autoscaling": "--autoscale-min/--autoscale-max", "cluster.autoscaling.min_size": "--autoscale-min",
		"cluster.autoscaling.max_size": "--autoscale-max", "min_size": "--autoscale-min", "max_size": "--autoscale-max",
	},
	"scale": {
		"worker_node_count": "--workers", "service_offering": "--offering", "remove_nodes": "--remove-node",
		"autoscaling": "--autoscale-min/--autoscale-max", "autoscaling.min_size": "--autoscale-min",
		"autoscaling.max_size": "--autoscale-max", "min_size": "--autoscale-min", "max_size": "--autoscale-max",
	},
	"upgrade":      {"kubernetes_version": "VERSION"},
	"add-nodes":    {"machines": "MACHINE"},
	"remove-nodes": {"nodes": "MACHINE"},
	"versions create": {
		"kubernetes_version": "VERSION", "kubernetes_version_id": "VERSION", "kubernetes_version.min_cpus": "--min-cpus",
		"kubernetes_version.min_memory_mb": "--min-memory-mb", "kubernetes_version.binaries_iso": "--iso",
	},
	"versions update": {
		"kubernetes_version": "VERSION", "kubernetes_version.name": "VERSION", "kubernetes_version.min_cpus": "--min-cpus",
		"kubernetes_version.min_memory_mb": "--min-memory-mb", "kubernetes_version.binaries_iso": "--iso",
		"kubernetes_version.state": "--state", "update_mask": "the flags",
	},
	"offerings create": {
		"service_offering_id": "NAME", "service_offering": "the offering", "service_offering.cpus": "--cpus",
		"service_offering.memory_mb": "--memory-mb", "service_offering.description": "--description",
	},
	"offerings update": {
		"service_offering.name": "NAME", "service_offering.description": "--description",
		"service_offering.state": "--state", "update_mask": "the flags",
	},
	"quota set": {
		"quota.limits.clusters": "--clusters", "quota.limits.nodes": "--nodes", "quota.limits.cpus": "--cpus",
		"quota.limits.memory_mb": "--memory-mb", "update_mask": "the flags",
	},
}

// field is the command line's name for a field path, the path itself when
// the command has none (a field no flag sets).
func (f flagNames) field(path string) string {
	if name, ok := f[path]; ok {
		return name
	}
	// One of a list: machines[1] is the second MACHINE.
	if base, index, ok := strings.Cut(path, "["); ok {
		if name, ok := f[base]; ok {
			return name + "[" + index
		}
	}
	return path
}

// identifier is a snake_case word, as field names are.
var identifier = regexp.MustCompile(`\b[a-z]+(?:_[a-z]+)+\b`)

// words replaces the field names a description mentions ("worker_node_count
// 3 must be within [min_size 1, max_size 2]") with their flags.
func (f flagNames) words(desc string) string {
	return identifier.ReplaceAllStringFunc(desc, func(w string) string {
		if name, ok := f[w]; ok && strings.HasPrefix(name, "--") {
			return name
		}
		return w
	})
}

// sortedKeys is m's keys in order (stable messages and tests).
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
