//go:build tools

// Package k8sbuild pins the Kubernetes and etcd main packages that
// scripts/build-k8s.sh compiles for draguard's local control plane.
// The blank imports only exist so that `go mod tidy` keeps every
// dependency of these commands in go.sum; nothing here is compiled.
package k8sbuild

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
