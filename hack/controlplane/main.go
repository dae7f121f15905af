// Command controlplane is a multi-call binary bundling kube-apiserver,
// kube-controller-manager and kubectl from k8s.io/kubernetes, for running a
// real (node-less) Kubernetes control plane in tests.
//
// It dispatches on the basename of argv[0] (symlinks named kube-apiserver,
// kube-controller-manager or kubectl), or else on its first argument:
//
//	controlplane kube-apiserver --etcd-servers=...
//
// Each entry point mirrors upstream's cmd/<name>/<name>.go main.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zone support, as in upstream mains

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl client auth plugins
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"

	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

var commands = map[string]func() int{
	"kube-apiserver": func() int {
		return cli.Run(apiserver.NewAPIServerCommand())
	},
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kubectl": func() int {
		// As upstream cmd/kubectl: set verbosity before command construction.
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
		command := kubectlcmd.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			kubectlutil.CheckErr(err) // prints and exits non-zero
		}
		return 0
	},
}

func names() string {
	n := make([]string, 0, len(commands))
	for k := range commands {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

func main() {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	run, ok := commands[name]
	if !ok && len(os.Args) > 1 {
		if run, ok = commands[os.Args[1]]; ok {
			// Drop our own argv[0] so the subcommand sees the argv it would
			// as a standalone binary (cobra and kubectl read os.Args).
			os.Args = os.Args[1:]
		}
	}
	if !ok {
		fmt.Fprintf(os.Stderr, "usage: %s COMMAND [ARGS...]  (or run via a symlink named COMMAND)\ncommands: %s\n", name, names())
		os.Exit(2)
	}
	os.Exit(run())
}
