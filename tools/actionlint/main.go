// actionlint checks GitHub Actions workflows with github.com/rhysd/actionlint (its own command, so the
// rules, messages and exit status are actionlint's): tests run it over .github/workflows.
package main

import (
	"os"

	"github.com/rhysd/actionlint"
)

func main() {
	cmd := actionlint.Command{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	os.Exit(cmd.Main(os.Args))
}
