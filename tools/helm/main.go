// Command helm renders a chart the way `helm template` does, using Helm's own library
// (helm.sh/helm/v3): draguard's tests review charts through it where no helm binary is installed.
//
//	helm template RELEASE CHART [--namespace NS] [-f VALUES]... [--set K=V]...
package main

import (
	"fmt"
	"os"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "Error: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	args := os.Args[1:]
	if len(args) < 3 || args[0] != "template" {
		fail("usage: helm template RELEASE CHART [--namespace NS] [-f VALUES]... [--set K=V]...")
	}
	release, chartPath := args[1], args[2]
	namespace := "default"
	opts := values.Options{}
	for i := 3; i < len(args); i++ {
		next := func() string {
			if i+1 >= len(args) {
				fail("flag %s needs a value", args[i])
			}
			i++
			return args[i]
		}
		switch a := args[i]; {
		case a == "--namespace" || a == "-n":
			namespace = next()
		case strings.HasPrefix(a, "--namespace="):
			namespace = strings.TrimPrefix(a, "--namespace=")
		case a == "-f" || a == "--values":
			opts.ValueFiles = append(opts.ValueFiles, next())
		case a == "--set":
			opts.Values = append(opts.Values, next())
		default:
			fail("unknown flag %q", a)
		}
	}
	chrt, err := loader.Load(chartPath)
	if err != nil {
		fail("%v", err)
	}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		fail("%v", err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = release
	install.Namespace = namespace
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	rel, err := install.Run(chrt, vals)
	if err != nil {
		fail("%v", err)
	}
	fmt.Print(rel.Manifest)
}
