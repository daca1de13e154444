package service

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/clusterd/clusterd/infra"
)

// TestEveryInfrastructureChangeIsAStep reads this package's source: every
// call of an infrastructure method that changes something (those taking an
// infra.Call) must be made inside the function an operation hands to o.do
// (or o.fix, which runs it through o.do), so that its failure is the
// operation's STEP_FAILED naming the step, on every path (adopted runs and
// repairs included, which the end-to-end tests reach only in part). A scale
// once provisioned its workers with a direct call, and its failures ended
// INTERNAL "internal error".
func TestEveryInfrastructureChangeIsAStep(t *testing.T) {
	changes := map[string]bool{}
	it := reflect.TypeFor[infra.Infrastructure]()
	for i := range it.NumMethod() {
		if m := it.Method(i); m.Type.NumIn() > 1 && m.Type.In(1) == reflect.TypeFor[infra.Call]() {
			changes[m.Name] = true
		}
	}
	if len(changes) != len(infra.Steps()) {
		t.Fatalf("%d infrastructure methods take an infra.Call, for %d steps: %v", len(changes), len(infra.Steps()), changes)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	calls := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var stack []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			if sel, ok := n.(*ast.SelectorExpr); ok && changes[sel.Sel.Name] && isInfraField(sel.X) {
				calls++
				if !inStep(stack) {
					t.Errorf("%s: infra %s is used outside o.do: a failure there is not the operation's STEP_FAILED naming its step",
						fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			stack = append(stack, n)
			return true
		})
	}
	if calls < len(changes) {
		t.Errorf("found %d calls of the %d infrastructure changes; the source was not read as expected", calls, len(changes))
	}
}

// isInfraField reports whether x is the service's infrastructure (s.infra,
// o.s.infra).
func isInfraField(x ast.Expr) bool {
	sel, ok := x.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "infra"
}

// inStep reports whether the innermost function literal on stack is an
// argument of a call of do or fix.
func inStep(stack []ast.Node) bool {
	for i := len(stack) - 1; i > 0; i-- {
		lit, ok := stack[i].(*ast.FuncLit)
		if !ok {
			continue
		}
		call, ok := stack[i-1].(*ast.CallExpr)
		if !ok {
			return false
		}
		fun, ok := call.Fun.(*ast.SelectorExpr)
		return ok && (fun.Sel.Name == "do" || fun.Sel.Name == "fix") && slices.Contains(call.Args, ast.Expr(lit))
	}
	return false
}
