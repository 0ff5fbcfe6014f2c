//go:build tools

// Package tools names the commands `make kube-tools` builds, so `go mod tidy` keeps them pinned.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
