package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// outputFormats are the values of -o, for --help, completion and errors.
var outputFormats = []string{"table", "wide", "json", "yaml", "name", "jsonpath=TEMPLATE"}

// checkOutput refuses an -o value clusterctl does not know, or a jsonpath
// template it cannot parse, before any request is sent.
func checkOutput(o string) error {
	if tmpl, ok := strings.CutPrefix(o, "jsonpath="); ok {
		if _, err := parseJSONPath(tmpl); err != nil {
			return fmt.Errorf("-o jsonpath: %w", err)
		}
		return nil
	}
	switch o {
	case "table", "wide", "json", "yaml", "name":
		return nil
	}
	return fmt.Errorf("--output %q: want one of %s", o, strings.Join(outputFormats, ", "))
}

// view is one result as every output format shows it: the API's message
// (json, yaml, jsonpath), the resource names it holds (name) and a table
// (table; wide adds columns).
type view struct {
	msg proto.Message
	// list: msg is a List response, whose repeated field jsonpath also
	// calls .items, as kubectl's lists do.
	list bool
	// names are printed by -o name; nil (not empty) when msg has none.
	names []string
	table func(wide bool) error
}

// show prints v in the format -o asks for.
func (a *app) show(v view) error {
	switch {
	case a.output == "json":
		return a.printJSON(v.msg)
	case a.output == "yaml":
		return a.printYAML(v.msg)
	case a.output == "name" && v.names == nil:
		return usageError{fmt.Errorf("-o name: %T has no resource name; use -o json, yaml or jsonpath", v.msg)}
	case a.output == "name":
		for _, n := range v.names {
			fmt.Fprintln(a.stdout, n)
		}
		return nil
	case strings.HasPrefix(a.output, "jsonpath="):
		return a.printJSONPath(v.msg, v.list, strings.TrimPrefix(a.output, "jsonpath="))
	}
	return v.table(a.output == "wide")
}

// printYAML writes the protojson of a resource as YAML: the same fields,
// names and order as -o json.
func (a *app) printYAML(m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %T as JSON: %w", m, err)
	}
	out, err := jsonToYAML(b)
	if err != nil {
		return fmt.Errorf("encode %T as YAML: %w", m, err)
	}
	_, err = a.stdout.Write(out)
	return err
}

// jsonToYAML re-encodes a JSON document as block YAML, keeping its key
// order (YAML reads JSON; only the styles change).
func jsonToYAML(b []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	var plain func(n *yaml.Node)
	plain = func(n *yaml.Node) {
		n.Style = 0 // the encoder quotes what would otherwise read as another type
		for _, c := range n.Content {
			plain(c)
		}
	}
	plain(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// printJSONPath fills a jsonpath template from the protojson of m, with
// unset fields present (their zero values), as kubectl -o jsonpath does.
func (a *app) printJSONPath(m proto.Message, list bool, tmpl string) error {
	nodes, err := parseJSONPath(tmpl)
	if err != nil {
		return fmt.Errorf("-o jsonpath: %w", err)
	}
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %T as JSON: %w", m, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return fmt.Errorf("decode %T: %w", m, err)
	}
	if obj, ok := root.(map[string]any); ok && list {
		// The list's resources: its first repeated message field.
		fields := m.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			if f := fields.Get(i); f.IsList() && f.Kind() == protoreflect.MessageKind {
				if _, taken := obj["items"]; !taken {
					obj["items"] = obj[f.JSONName()]
				}
				break
			}
		}
	}
	var out bytes.Buffer
	if err := execJSONPath(&out, nodes, root, root); err != nil {
		return fmt.Errorf("-o jsonpath: %w", err)
	}
	_, err = a.stdout.Write(out.Bytes())
	return err
}

// jpNode is a piece of a jsonpath template: literal text, an expression
// whose values are printed, or a range over an expression's values.
type jpNode struct {
	text  string
	path  []jpStep
	isVal bool
	rng   []jpNode // the body of {range path}...{end}
	isRng bool
}

// jpStep is one step of a path: a field (or * for every field), an index
// (negative from the end) or [*] for every element.
type jpStep struct {
	field string
	index int
	kind  byte // 'f' field, 'i' index, '*' every element or field
}

// parseJSONPath parses kubectl's template syntax, a subset: text, {.a.b},
// {.a[0]}, {.a[-1]}, {.a[*].b}, {.a.*}, {$} and {@}, {"literal"}, and
// {range PATH}...{end}.
func parseJSONPath(tmpl string) ([]jpNode, error) {
	nodes, rest, err := parseJPNodes(tmpl, false)
	if err != nil {
		return nil, err
	}
	if rest != "" {
		return nil, errors.New("{end} without {range}")
	}
	return nodes, nil
}

func parseJPNodes(s string, inRange bool) ([]jpNode, string, error) {
	var nodes []jpNode
	for s != "" {
		open := strings.IndexByte(s, '{')
		if open < 0 {
			nodes = append(nodes, jpNode{text: s})
			s = ""
			break
		}
		if open > 0 {
			nodes = append(nodes, jpNode{text: s[:open]})
		}
		expr, rest, err := cutExpression(s[open+1:])
		if err != nil {
			return nil, "", err
		}
		s = rest
		expr = strings.TrimSpace(expr)
		switch {
		case expr == "end":
			if !inRange {
				return nil, "", errors.New("{end} without {range}")
			}
			return nodes, s, nil
		case strings.HasPrefix(expr, "range "):
			path, err := parseJPPath(strings.TrimSpace(strings.TrimPrefix(expr, "range ")))
			if err != nil {
				return nil, "", err
			}
			body, rest, err := parseJPNodes(s, true)
			if err != nil {
				return nil, "", err
			}
			nodes = append(nodes, jpNode{path: path, rng: body, isRng: true})
			s = rest
		case strings.HasPrefix(expr, `"`):
			lit, err := strconv.Unquote(expr)
			if err != nil {
				return nil, "", fmt.Errorf("literal %s: %w", expr, err)
			}
			nodes = append(nodes, jpNode{text: lit})
		default:
			path, err := parseJPPath(expr)
			if err != nil {
				return nil, "", err
			}
			nodes = append(nodes, jpNode{path: path, isVal: true})
		}
	}
	if inRange {
		return nil, "", errors.New("{range} without {end}")
	}
	return nodes, "", nil
}

// cutExpression splits "expr}rest" at the closing brace, outside quotes.
func cutExpression(s string) (expr, rest string, err error) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == '}' && !quoted:
			return s[:i], s[i+1:], nil
		}
	}
	return "", "", errors.New("unclosed {")
}

// parseJPPath parses .a.b[0][*].c (from the current value) or $... (from
// the root; kubectl treats both alike outside range).
func parseJPPath(p string) ([]jpStep, error) {
	orig := p
	p = strings.TrimPrefix(strings.TrimPrefix(p, "$"), "@")
	var steps []jpStep
	for p != "" {
		switch {
		case strings.HasPrefix(p, ".."):
			return nil, fmt.Errorf("%q: recursive descent (..) is not supported", orig)
		case p[0] == '.':
			p = p[1:]
			end := strings.IndexAny(p, ".[")
			if end < 0 {
				end = len(p)
			}
			name := p[:end]
			p = p[end:]
			switch name {
			case "":
				if p != "" {
					return nil, fmt.Errorf("%q: an empty field name", orig)
				}
			case "*":
				steps = append(steps, jpStep{kind: '*'})
			default:
				steps = append(steps, jpStep{kind: 'f', field: name})
			}
		case p[0] == '[':
			end := strings.IndexByte(p, ']')
			if end < 0 {
				return nil, fmt.Errorf("%q: unclosed [", orig)
			}
			in := strings.TrimSpace(p[1:end])
			p = p[end+1:]
			if in == "*" {
				steps = append(steps, jpStep{kind: '*'})
				continue
			}
			if q, err := strconv.Unquote(strings.ReplaceAll(in, "'", `"`)); err == nil {
				steps = append(steps, jpStep{kind: 'f', field: q})
				continue
			}
			n, err := strconv.Atoi(in)
			if err != nil {
				return nil, fmt.Errorf("%q: [%s]: want an index, * or a 'quoted' field (filters and slices are not supported)", orig, in)
			}
			steps = append(steps, jpStep{kind: 'i', index: n})
		default:
			return nil, fmt.Errorf("%q: want a path starting with . (e.g. {.name}) or a \"quoted literal\"", orig)
		}
	}
	return steps, nil
}

// walk applies steps to v; a missing field or index yields nothing.
func walk(steps []jpStep, vals []any) []any {
	for _, s := range steps {
		var next []any
		for _, v := range vals {
			switch s.kind {
			case 'f':
				if obj, ok := v.(map[string]any); ok {
					if f, ok := obj[s.field]; ok {
						next = append(next, f)
					}
				}
			case 'i':
				if arr, ok := v.([]any); ok {
					i := s.index
					if i < 0 {
						i += len(arr)
					}
					if i >= 0 && i < len(arr) {
						next = append(next, arr[i])
					}
				}
			case '*':
				switch c := v.(type) {
				case []any:
					next = append(next, c...)
				case map[string]any:
					keys := make([]string, 0, len(c))
					for k := range c {
						keys = append(keys, k)
					}
					slices.Sort(keys)
					for _, k := range keys {
						next = append(next, c[k])
					}
				}
			}
		}
		vals = next
	}
	return vals
}

// execJSONPath prints nodes with cur as the current value (@): the values
// of one expression separated by spaces, as kubectl prints them.
func execJSONPath(w io.Writer, nodes []jpNode, root, cur any) error {
	for _, n := range nodes {
		switch {
		case n.isRng:
			for _, v := range walk(n.path, []any{cur}) {
				items := []any{v}
				if arr, ok := v.([]any); ok && (len(n.path) == 0 || n.path[len(n.path)-1].kind != '*') {
					items = arr // {range .items} ranges over the list, like {range .items[*]}
				}
				for _, item := range items {
					if err := execJSONPath(w, n.rng, root, item); err != nil {
						return err
					}
				}
			}
		case n.isVal:
			for i, v := range walk(n.path, []any{cur}) {
				if i > 0 {
					fmt.Fprint(w, " ")
				}
				if err := printJSONValue(w, v); err != nil {
					return err
				}
			}
		default:
			fmt.Fprint(w, n.text)
		}
	}
	return nil
}

// printJSONValue prints a scalar as text and anything else as JSON.
func printJSONValue(w io.Writer, v any) error {
	switch t := v.(type) {
	case nil:
		return nil
	case string:
		_, err := io.WriteString(w, t)
		return err
	case json.Number, bool:
		_, err := fmt.Fprint(w, t)
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// age is how long ago t was, kubectl's way: 42s, 5m10s, 3h, 2d4h, 40d.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return shortDuration(now.Sub(t))
}

// shortDuration writes d with at most two units, coarser as it grows.
func shortDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch s := int64(d.Round(time.Second) / time.Second); {
	case s < 120:
		return fmt.Sprintf("%ds", s)
	case s < 10*60:
		if s%60 == 0 {
			return fmt.Sprintf("%dm", s/60)
		}
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	case s < 3*3600:
		return fmt.Sprintf("%dm", s/60)
	case s < 8*3600:
		if m := (s / 60) % 60; m != 0 {
			return fmt.Sprintf("%dh%dm", s/3600, m)
		}
		return fmt.Sprintf("%dh", s/3600)
	case s < 48*3600:
		return fmt.Sprintf("%dh", s/3600)
	case s < 8*86400:
		if h := (s / 3600) % 24; h != 0 {
			return fmt.Sprintf("%dd%dh", s/86400, h)
		}
		return fmt.Sprintf("%dd", s/86400)
	}
	return fmt.Sprintf("%dd", int64(d/(24*time.Hour)))
}
