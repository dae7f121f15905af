// kstatus prints what sigs.k8s.io/cli-utils/pkg/kstatus, the library behind Flux's
// health checks and Helm 4's --wait, computes for one Kubernetes object: the object is read
// as JSON or YAML on stdin; stdout is one JSON line {"status": ..., "message": ...} where
// status is one of Current, InProgress, Failed, Terminating, Unknown.
//
// Built by hack/build-kstatus.sh from the module versions pinned in go.mod; used by
// tests/integration/test_kstatus.py.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

type result struct {
	Status     string             `json:"status"`
	Message    string             `json:"message"`
	Conditions []status.Condition `json:"conditions"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	data, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("reading stdin: %w", err)
	}
	doc, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("stdin is not JSON or YAML: %w", err)
	}
	// As a client reads it: integers stay int64, which kstatus's accessors require.
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(doc); err != nil {
		return fmt.Errorf("stdin is not a Kubernetes object: %w", err)
	}
	res, err := status.Compute(obj)
	if err != nil {
		return fmt.Errorf("computing the status: %w", err)
	}
	conditions := res.Conditions
	if conditions == nil {
		conditions = []status.Condition{}
	}
	return json.NewEncoder(out).Encode(result{string(res.Status), res.Message, conditions})
}
