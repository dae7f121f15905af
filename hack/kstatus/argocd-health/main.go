// argocd-health runs an Argo CD resource health check written in Lua, as Argo CD runs one:
// in gopher-lua (the interpreter Argo CD embeds), with the base, table, string and math
// libraries, the resource as the global `obj`, and the table the script returns as the
// health ({status, message}). The script is the file named by the only argument; the
// object is read as JSON or YAML on stdin; stdout is the returned table as one JSON line.
//
// Built by hack/build-kstatus.sh; used by tests/integration/test_kstatus.py to check the
// health check docs/gitops.md ships.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT.lua < object.yaml")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "argocd-health: %v\n", err)
		os.Exit(1)
	}
}

func run(script string, in io.Reader, out io.Writer) error {
	data, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("reading stdin: %w", err)
	}
	obj := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf("stdin is not a JSON or YAML object: %w", err)
	}
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoFile(script); err != nil {
		return fmt.Errorf("running %s: %w", script, err)
	}
	table, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return fmt.Errorf("%s returned %s, not a table", script, L.Get(-1).Type())
	}
	health := map[string]string{}
	table.ForEach(func(k, v lua.LValue) { health[k.String()] = v.String() })
	return json.NewEncoder(out).Encode(health)
}

// toLua converts decoded JSON into Lua values: objects and arrays become tables (arrays
// 1-based), numbers, strings and booleans their Lua kind, null nil.
func toLua(L *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case map[string]interface{}:
		t := L.NewTable()
		for key, item := range v {
			t.RawSetString(key, toLua(L, item))
		}
		return t
	case []interface{}:
		t := L.NewTable()
		for _, item := range v {
			t.Append(toLua(L, item))
		}
		return t
	case string:
		return lua.LString(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	default:
		return lua.LNil
	}
}
