// cdicheck loads CDI specs with the reference library (tags.cncf.io/container-device-interface),
// resolves the named devices and applies them to an empty OCI spec, printing the result as JSON.
//
//	cdicheck --spec-dir DIR [--env K=V]... ID...
//
// Exit status 0: every spec in DIR loaded without error and every ID was injected.
// Exit status 1: a spec error or an unresolvable ID (the JSON names them); 2: bad usage.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type result struct {
	Specs      []string            `json:"specs"`
	SpecErrors map[string][]string `json:"specErrors"`
	Devices    []string            `json:"devices"`
	Unresolved []string            `json:"unresolved"`
	InjectErr  string              `json:"injectError,omitempty"`
	OCI        *oci.Spec           `json:"oci,omitempty"`
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	dir := flag.String("spec-dir", "", "directory holding the CDI spec files")
	var env multi
	flag.Var(&env, "env", "environment variable already in the container (repeatable)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "cdicheck: --spec-dir is required")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(*dir), cdi.WithAutoRefresh(false))
	res := result{SpecErrors: map[string][]string{}, Devices: []string{}, Unresolved: []string{}}
	if err != nil {
		res.SpecErrors["<cache>"] = []string{err.Error()}
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			res.SpecErrors[path] = append(res.SpecErrors[path], e.Error())
		}
	}
	for _, vendor := range cache.ListVendors() {
		for _, s := range cache.GetVendorSpecs(vendor) {
			res.Specs = append(res.Specs, s.GetPath())
		}
	}
	res.Devices = append(res.Devices, cache.ListDevices()...)
	sort.Strings(res.Specs)
	ok := len(res.SpecErrors) == 0
	if ids := flag.Args(); len(ids) > 0 {
		spec := &oci.Spec{Process: &oci.Process{Env: env}, Linux: &oci.Linux{}}
		unresolved, err := cache.InjectDevices(spec, ids...)
		if err != nil {
			res.InjectErr = err.Error()
			ok = false
		}
		if len(unresolved) > 0 {
			res.Unresolved = unresolved
			ok = false
		}
		res.OCI = spec
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "cdicheck:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}
