package service

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.einride.tech/aip/filtering"
	expr "google.golang.org/genproto/googleapis/api/expr/v1alpha1"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// AIP-160 filters. go.einride.tech/aip/filtering parses the grammar (AND, OR,
// NOT or -, parentheses, comparators; OR binds tighter than AND, as AIP-160
// says); this file gives the parsed expression clusterd's meaning and turns
// it into a repository.Filter, which the repository alone turns into SQL.
// einride's own type checker is not used: it reports no positions, and it
// knows no bare words (`display_name = web`), which clusterd has always
// accepted.

// valueKind is what a filter field compares with.
type valueKind int

const (
	textValue    valueKind = iota // a bare word or a quoted string
	stateValue                    // a Cluster.State name, any case
	clusterValue                  // clusters/{uuid}
	boolValue                     // true or false
	timeValue                     // an RFC 3339 timestamp; the only kind <, <=, >, >= apply to
)

// filterField is one field a collection can be filtered on.
type filterField struct {
	name  string
	field repository.Field
	kind  valueKind
}

// filterSchema lists the fields of one collection, in the order error
// messages name them.
type filterSchema []filterField

func (s filterSchema) lookup(name string) (filterField, bool) {
	i := slices.IndexFunc(s, func(f filterField) bool { return f.name == name })
	if i < 0 {
		return filterField{}, false
	}
	return s[i], true
}

func (s filterSchema) names() string {
	names := make([]string, len(s))
	for i, f := range s {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

// clusterFilter is what ListClusters filters on.
var clusterFilter = filterSchema{
	{"state", repository.ClusterState, stateValue},
	{"display_name", repository.ClusterDisplayName, textValue},
	{"account", repository.ClusterAccount, textValue},
	{"create_time", repository.ClusterCreateTime, timeValue},
	{"update_time", repository.ClusterUpdateTime, timeValue},
}

// operationFilter is what ListOperations filters on.
var operationFilter = filterSchema{
	{"cluster", repository.JobCluster, clusterValue},
	{"done", repository.JobDone, boolValue},
	{"verb", repository.JobKind, textValue},
	{"create_time", repository.JobCreateTime, timeValue},
	{"update_time", repository.JobUpdateTime, timeValue},
}

// parsedFilter is a client's filter, ready for the repository.
type parsedFilter struct {
	Where repository.Filter
	// Uses holds the fields the filter names.
	Uses map[string]bool
}

// parseFilter reads an AIP-160 filter on the fields of schema. Every mistake
// is an INVALID_ARGUMENT on field (the request's filter field) whose message
// names the column and the token at fault, so a client never gets a silently
// unfiltered list.
func parseFilter(field, filter string, schema filterSchema) (parsedFilter, error) {
	out := parsedFilter{Uses: map[string]bool{}}
	if len(filter) > maxFilterLen {
		return out, invalid(field, "must be at most %d bytes, got %d", maxFilterLen, len(filter))
	}
	trimmed := strings.TrimSpace(filter)
	if trimmed == "" {
		return out, nil
	}
	// einride's positions are offsets in the trimmed filter.
	lead := len(filter) - len(strings.TrimLeft(filter, " \t\r\n"))
	var p filtering.Parser
	p.Init(trimmed)
	parsed, err := p.Parse()
	if err != nil {
		return out, syntaxError(field, filter, lead, err)
	}
	c := filterCompiler{field: field, filter: filter, lead: lead, schema: schema,
		positions: parsed.GetSourceInfo().GetPositions(), uses: out.Uses}
	if out.Where, err = c.compile(parsed.GetExpr()); err != nil {
		return out, err
	}
	return out, nil
}

// syntaxError turns einride's innermost parse error into a one-line message
// with its column.
func syntaxError(field, filter string, lead int, err error) error {
	type positioned interface {
		Position() filtering.Position
		Message() string
	}
	var inner positioned
	for e := err; e != nil; e = errors.Unwrap(e) {
		if pe, ok := e.(positioned); ok {
			inner = pe
		}
	}
	if inner == nil {
		return invalid(field, "cannot parse %q: %v", Clip(filter), err)
	}
	msg := inner.Message()
	hint := ""
	if strings.Contains(msg, "token -") || strings.Contains(msg, "token :") || strings.Contains(msg, "token .") {
		hint = ` (quote values that contain "-", ":" or ".", e.g. "web-1" or "2026-01-02T15:04:05Z")`
	}
	switch {
	case msg == "parse token":
		msg = "a value or a condition is missing"
	case msg == "unexpected trailing token WS":
		msg = "unexpected text after a complete condition (a dangling AND or OR?)"
	default:
		msg = strings.Replace(msg, "unexpected trailing token ", "unexpected ", 1)
	}
	return invalid(field, "%s at column %d of %q%s", msg, int(inner.Position().Offset)+lead+1, Clip(filter), hint)
}

// filterCompiler walks one parsed filter.
type filterCompiler struct {
	field     string
	filter    string
	lead      int
	schema    filterSchema
	positions map[int64]int32
	uses      map[string]bool
}

func (c *filterCompiler) errorf(e *expr.Expr, format string, args ...any) error {
	return invalid(c.field, "%s at column %d of %q", fmt.Sprintf(format, args...), int(c.positions[e.GetId()])+c.lead+1, Clip(c.filter))
}

// comparators are the AIP-160 comparators clusterd accepts, with their
// repository operators.
var comparators = map[string]repository.Op{
	filtering.FunctionEquals: repository.Eq, filtering.FunctionNotEquals: repository.Ne,
	filtering.FunctionLessThan: repository.Lt, filtering.FunctionLessEquals: repository.Le,
	filtering.FunctionGreaterThan: repository.Gt, filtering.FunctionGreaterEquals: repository.Ge,
}

func (c *filterCompiler) compile(e *expr.Expr) (repository.Filter, error) {
	call := e.GetCallExpr()
	if call == nil {
		if id := e.GetIdentExpr(); id != nil {
			return repository.Filter{}, c.errorf(e, "%q is not a condition: compare it, e.g. %s = ...", Clip(id.GetName()), Clip(id.GetName()))
		}
		return repository.Filter{}, c.errorf(e, "%s is not a condition: use field = value", c.text(e))
	}
	switch fn := call.GetFunction(); fn {
	case filtering.FunctionAnd, filtering.FunctionOr:
		args := make([]repository.Filter, len(call.GetArgs()))
		for i, a := range call.GetArgs() {
			f, err := c.compile(a)
			if err != nil {
				return repository.Filter{}, err
			}
			args[i] = f
		}
		if fn == filtering.FunctionAnd {
			return repository.And(args...), nil
		}
		return repository.Or(args...), nil
	case filtering.FunctionNot:
		f, err := c.compile(call.GetArgs()[0])
		if err != nil {
			return repository.Filter{}, err
		}
		return repository.Not(f), nil
	case filtering.FunctionFuzzyAnd:
		return repository.Filter{}, c.errorf(call.GetArgs()[1], "conditions must be joined by AND or OR")
	case filtering.FunctionHas:
		return repository.Filter{}, c.errorf(e, "the has operator \":\" is not supported: use =")
	}
	op, ok := comparators[call.GetFunction()]
	if !ok || len(call.GetArgs()) != 2 {
		return repository.Filter{}, c.errorf(e, "function %s() is not supported", call.GetFunction())
	}
	return c.comparison(e, op, call.GetArgs()[0], call.GetArgs()[1])
}

// comparison is `name op value`.
func (c *filterCompiler) comparison(e *expr.Expr, op repository.Op, lhs, rhs *expr.Expr) (repository.Filter, error) {
	ident := lhs.GetIdentExpr()
	if ident == nil {
		return repository.Filter{}, c.errorf(lhs, "%s is not a field (fields: %s)", c.text(lhs), c.schema.names())
	}
	f, ok := c.schema.lookup(ident.GetName())
	if !ok {
		return repository.Filter{}, c.errorf(lhs, "unknown field %q (fields: %s)", Clip(ident.GetName()), c.schema.names())
	}
	c.uses[f.name] = true
	if f.kind != timeValue && op != repository.Eq && op != repository.Ne {
		return repository.Filter{}, c.errorf(e, "%s can only be compared with = or != (<, <=, >, >= apply to create_time and update_time)", f.name)
	}
	text, ok := c.value(rhs)
	if !ok {
		return repository.Filter{}, c.errorf(rhs, "the value of %s must be a word or a quoted string, not %s", f.name, c.text(rhs))
	}
	var v any
	switch f.kind {
	case textValue:
		v = text
	case stateValue:
		st, err := lifecycle.ParseState(strings.ToUpper(text))
		if err != nil {
			return repository.Filter{}, c.errorf(rhs, "%q is not a state (%s)", Clip(text), stateNames())
		}
		v = st
	case clusterValue:
		id, err := parseName(c.field, text, clusterPrefix)
		if err != nil {
			return repository.Filter{}, c.errorf(rhs, "%q is not a cluster name (\"clusters/{uuid}\", quoted)", Clip(text))
		}
		v = id
	case boolValue:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return repository.Filter{}, c.errorf(rhs, "%s must be true or false, not %q", f.name, Clip(text))
		}
		v = b
	case timeValue:
		t, err := time.Parse(time.RFC3339Nano, text)
		if err != nil {
			return repository.Filter{}, c.errorf(rhs, "%q is not an RFC 3339 timestamp (quote it, e.g. %s > \"2026-01-02T15:04:05Z\")", Clip(text), f.name)
		}
		v = t
	}
	return repository.Compare(f.field, op, v), nil
}

// value reads a comparison's right-hand side: a bare word, a quoted string,
// or a number taken as its text (a display name may be all digits).
func (c *filterCompiler) value(e *expr.Expr) (string, bool) {
	if id := e.GetIdentExpr(); id != nil {
		return id.GetName(), true
	}
	switch k := e.GetConstExpr().GetConstantKind().(type) {
	case *expr.Constant_StringValue:
		return k.StringValue, true
	case *expr.Constant_Int64Value:
		return strconv.FormatInt(k.Int64Value, 10), true
	case *expr.Constant_DoubleValue:
		return strconv.FormatFloat(k.DoubleValue, 'f', -1, 64), true
	}
	return "", false
}

// text describes an expression in an error message.
func (c *filterCompiler) text(e *expr.Expr) string {
	switch {
	case e.GetSelectExpr() != nil:
		return fmt.Sprintf("%q", Clip(c.text(e.GetSelectExpr().GetOperand())+"."+e.GetSelectExpr().GetField()))
	case e.GetIdentExpr() != nil:
		return Clip(e.GetIdentExpr().GetName())
	case e.GetCallExpr() != nil:
		return "a function call or a condition"
	case e.GetConstExpr() != nil:
		v, _ := c.value(e)
		return fmt.Sprintf("%q", Clip(v))
	}
	return "this"
}

// stateNames lists the states a filter can name.
func stateNames() string {
	var names []string
	for _, st := range lifecycle.States() {
		names = append(names, st.String())
	}
	return strings.Join(names, ", ")
}
