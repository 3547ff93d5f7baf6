// ocibundle pushes the Kustomize bundle's OCI layout (scripts/release/bundle.py) to a registry and
// reads it back the way the two GitOps engines do, with the libraries they use:
//
//	ocibundle check LAYOUT                      every manifest of the layout, read by its engine's rules
//	ocibundle push [--plain-http] LAYOUT NAME=REF...   copy the layout's manifest NAME to REF (oras-go)
//	ocibundle pull --as flux|argocd [--plain-http] REF DIR   fetch REF and extract it into DIR
//	ocibundle serve ADDR                        an in-memory registry (go-containerregistry's), for tests
//
// The engines' rules, as their sources state them:
//   - Flux (source-controller's OCIRepository, `flux pull artifact`): go-containerregistry pulls the
//     manifest and extracts the first layer as a gzipped tar, whatever its media type (unless the
//     OCIRepository selects a media type); `flux push artifact` writes config
//     application/vnd.cncf.flux.config.v1+json and layer application/vnd.cncf.flux.content.v1.tar+gzip.
//   - Argo CD (repo-server's OCI source): oras-go fetches the manifest; at most 10 layers, exactly one
//     "content" layer (media type ending in tar+gzip or tar), and that type in the allowed list, by default
//     application/vnd.oci.image.layer.v1.tar+gzip and application/vnd.cncf.helm.chart.content.v1.tar+gzip.
//
// push reads credentials from OCI_USERNAME and OCI_PASSWORD (in the release workflow: the actor and
// GITHUB_TOKEN). Every command prints one JSON document on success; errors go to stderr, exit status 1
// (2 for bad usage).
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/registry"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/retry"
)

const (
	fluxConfig  = "application/vnd.cncf.flux.config.v1+json"
	fluxContent = "application/vnd.cncf.flux.content.v1.tar+gzip"
	ociLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	helmContent = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
	// Bounds on what one bundle may unpack to: a few hundred small YAML files in practice.
	maxFiles = 5000
	maxBytes = 64 << 20
)

var argoAllowed = []string{ociLayer, helmContent}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// result is what check and pull print for one manifest.
type result struct {
	Name        string            `json:"name"`
	Digest      string            `json:"digest"`
	Config      string            `json:"configMediaType"`
	Layers      []string          `json:"layerMediaTypes"`
	Annotations map[string]string `json:"annotations"`
	Files       []string          `json:"files"`
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "ocibundle: %v\n", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return usageError{"usage: ocibundle check|push|pull|serve ... (see the source's header)"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	switch args[0] {
	case "check":
		if len(args) != 2 {
			return usageError{"usage: ocibundle check LAYOUT"}
		}
		return check(ctx, args[1])
	case "push":
		fs := flag.NewFlagSet("push", flag.ContinueOnError)
		plain := fs.Bool("plain-http", false, "talk HTTP, not HTTPS (a local test registry)")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() < 2 {
			return usageError{"usage: ocibundle push [--plain-http] LAYOUT NAME=REF..."}
		}
		return push(ctx, fs.Arg(0), fs.Args()[1:], *plain)
	case "pull":
		fs := flag.NewFlagSet("pull", flag.ContinueOnError)
		as := fs.String("as", "", "flux or argocd: whose rules to read the artifact by")
		plain := fs.Bool("plain-http", false, "talk HTTP, not HTTPS (a local test registry)")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 2 || (*as != "flux" && *as != "argocd") {
			return usageError{"usage: ocibundle pull --as flux|argocd [--plain-http] REF DIR"}
		}
		return pull(ctx, *as, fs.Arg(0), fs.Arg(1), *plain)
	case "serve":
		if len(args) != 2 {
			return usageError{"usage: ocibundle serve ADDR"}
		}
		return serve(args[1])
	}
	return usageError{fmt.Sprintf("unknown command %q (check, push, pull, serve)", args[0])}
}

func emit(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// check reads every manifest the layout's index names, by the rules of the engine it is named for
// (`flux`, `argocd`), verifying every digest and size on the way, and lists the files it would extract.
func check(ctx context.Context, dir string) error {
	store, err := oci.NewFromFS(ctx, os.DirFS(dir))
	if err != nil {
		return fmt.Errorf("%s: not an OCI image layout: %w", dir, err)
	}
	var names []string
	if err := store.Tags(ctx, "", func(tags []string) error { names = append(names, tags...); return nil }); err != nil {
		return fmt.Errorf("%s: reading index.json: %w", dir, err)
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: index.json names no manifest", dir)
	}
	var out []result
	for _, name := range names {
		if name != "flux" && name != "argocd" {
			return fmt.Errorf("%s: manifest %q: expected the names flux and argocd", dir, name)
		}
		tmp, err := os.MkdirTemp("", "ocibundle-check-")
		if err != nil {
			return err
		}
		r, err := readWithOras(ctx, store, name, name, tmp)
		os.RemoveAll(tmp)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", dir, name, err)
		}
		out = append(out, r)
	}
	return emit(out)
}

// readWithOras fetches `ref` from target (a layout or a registry) with oras-go, as Argo CD does, applies
// the rules of `as`, and extracts the chosen layer into dir.
func readWithOras(ctx context.Context, target oras.ReadOnlyTarget, ref, as, dir string) (result, error) {
	desc, err := target.Resolve(ctx, ref)
	if err != nil {
		return result{}, fmt.Errorf("resolve %s: %w", ref, err)
	}
	if desc.MediaType != ocispec.MediaTypeImageManifest {
		return result{}, fmt.Errorf("%s is a %s, not an OCI image manifest", ref, desc.MediaType)
	}
	raw, err := content.FetchAll(ctx, target, desc) // verifies size and digest
	if err != nil {
		return result{}, fmt.Errorf("fetch manifest: %w", err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return result{}, fmt.Errorf("manifest: %w", err)
	}
	if _, err := content.FetchAll(ctx, target, m.Config); err != nil {
		return result{}, fmt.Errorf("fetch config: %w", err)
	}
	layer, err := chooseLayer(m, as)
	if err != nil {
		return result{}, err
	}
	blob, err := content.FetchAll(ctx, target, layer)
	if err != nil {
		return result{}, fmt.Errorf("fetch layer: %w", err)
	}
	files, err := untgz(bytes.NewReader(blob), dir)
	if err != nil {
		return result{}, fmt.Errorf("extract layer %s: %w", layer.Digest, err)
	}
	return describe(ref, desc.Digest.String(), m, files), nil
}

// chooseLayer applies one engine's layer rules to a manifest.
func chooseLayer(m ocispec.Manifest, as string) (ocispec.Descriptor, error) {
	if len(m.Layers) == 0 {
		return ocispec.Descriptor{}, errors.New("no layers found in artifact")
	}
	if as == "flux" {
		// source-controller and the CLI take layers[0]; the media types are what `flux push` writes,
		// checked here so the flux manifest really is one of Flux's own.
		if m.Config.MediaType != fluxConfig || m.Layers[0].MediaType != fluxContent {
			return ocispec.Descriptor{}, fmt.Errorf("config %s / first layer %s: not the media types `flux push artifact` writes (%s, %s)",
				m.Config.MediaType, m.Layers[0].MediaType, fluxConfig, fluxContent)
		}
		for _, k := range []string{ocispec.AnnotationSource, ocispec.AnnotationRevision} {
			if m.Annotations[k] == "" {
				return ocispec.Descriptor{}, fmt.Errorf("annotation %s missing (flux pull/list artifacts read it)", k)
			}
		}
		return m.Layers[0], nil
	}
	if len(m.Layers) > 10 {
		return ocispec.Descriptor{}, fmt.Errorf("expected no more than 10 oci layers, got %d", len(m.Layers))
	}
	var chosen []ocispec.Descriptor
	for _, l := range m.Layers {
		if strings.HasSuffix(l.MediaType, "tar+gzip") || strings.HasSuffix(l.MediaType, "tar") {
			if !slices.Contains(argoAllowed, l.MediaType) {
				return ocispec.Descriptor{}, fmt.Errorf("oci layer media type %s is not in Argo CD's default allowed list %v", l.MediaType, argoAllowed)
			}
			chosen = append(chosen, l)
		}
	}
	if len(chosen) != 1 {
		return ocispec.Descriptor{}, fmt.Errorf("expected only a single oci content layer, got %d", len(chosen))
	}
	return chosen[0], nil
}

func describe(name, digest string, m ocispec.Manifest, files []string) result {
	r := result{Name: name, Digest: digest, Config: m.Config.MediaType, Annotations: m.Annotations, Files: files}
	for _, l := range m.Layers {
		r.Layers = append(r.Layers, l.MediaType)
	}
	return r
}

// untgz extracts a gzipped tar of regular files and directories into dir, refusing anything that
// would land outside it, links and devices, and more than maxFiles files or maxBytes bytes.
func untgz(r io.Reader, dir string) ([]string, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	var files []string
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return nil, fmt.Errorf("entry %q lies outside the extraction directory", h.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if len(files) >= maxFiles || total+h.Size > maxBytes {
				return nil, fmt.Errorf("more than %d files or %d bytes", maxFiles, maxBytes)
			}
			total += h.Size
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return nil, err
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(f, io.LimitReader(tr, h.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
			files = append(files, name)
		default:
			return nil, fmt.Errorf("entry %q: type %q is neither a file nor a directory", h.Name, h.Typeflag)
		}
	}
	sort.Strings(files)
	return files, nil
}

func repository(ref string, plain bool) (*remote.Repository, error) {
	repo, err := remote.NewRepository(ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	repo.PlainHTTP = plain
	client := &auth.Client{Client: retry.DefaultClient, Cache: auth.NewCache()}
	if user, pass := os.Getenv("OCI_USERNAME"), os.Getenv("OCI_PASSWORD"); user != "" || pass != "" {
		client.Credential = auth.StaticCredential(repo.Reference.Registry, auth.Credential{Username: user, Password: pass})
	}
	repo.Client = client
	return repo, nil
}

// push copies each named manifest of the layout (with its config and layer) to its reference.
func push(ctx context.Context, dir string, pairs []string, plain bool) error {
	store, err := oci.NewFromFS(ctx, os.DirFS(dir))
	if err != nil {
		return fmt.Errorf("%s: not an OCI image layout: %w", dir, err)
	}
	out := map[string]string{}
	for _, pair := range pairs {
		name, ref, ok := strings.Cut(pair, "=")
		if !ok || name == "" || ref == "" {
			return usageError{fmt.Sprintf("%q: expected NAME=REGISTRY/REPOSITORY:TAG", pair)}
		}
		repo, err := repository(ref, plain)
		if err != nil {
			return err
		}
		if repo.Reference.Reference == "" {
			return usageError{fmt.Sprintf("%s: name a tag to push to", ref)}
		}
		desc, err := oras.Copy(ctx, store, name, repo, repo.Reference.Reference, oras.DefaultCopyOptions)
		if err != nil {
			return fmt.Errorf("push %s to %s: %w", name, ref, err)
		}
		r := repo.Reference
		r.Reference = desc.Digest.String()
		out[name] = r.String()
	}
	return emit(out)
}

// pull reads REF the way `as` does: Flux with go-containerregistry (crane), Argo CD with oras-go.
func pull(ctx context.Context, as, ref, dir string, plain bool) error {
	if as == "argocd" {
		repo, err := repository(ref, plain)
		if err != nil {
			return err
		}
		r, err := readWithOras(ctx, repo, repo.Reference.Reference, as, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		r.Name = ref
		return emit(r)
	}
	opts := []crane.Option{crane.WithContext(ctx)}
	if plain {
		opts = append(opts, crane.Insecure)
	}
	img, err := crane.Pull(ref, opts...)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("%s: manifest: %w", ref, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("%s: manifest: %w", ref, err)
	}
	if _, err := chooseLayer(m, as); err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		return fmt.Errorf("%s: no layers found in artifact (%v)", ref, err)
	}
	blob, err := layers[0].Compressed() // verified against its digest as it is read
	if err != nil {
		return fmt.Errorf("%s: first layer: %w", ref, err)
	}
	defer blob.Close()
	files, err := untgz(blob, dir)
	if err != nil {
		return fmt.Errorf("%s: extract the first layer: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	return emit(describe(ref, digest.String(), m, files))
}

// serve runs go-containerregistry's in-memory registry on addr and prints the address it listens on.
func serve(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// One line, so a caller can read the address before the server's first request.
	line, err := json.Marshal(map[string]string{"address": ln.Addr().String()})
	if err != nil {
		return err
	}
	if _, err := fmt.Println(string(line)); err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}
