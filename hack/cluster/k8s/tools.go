//go:build tools

// Package tools pins the Kubernetes commands this wrapper module builds.
// k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces the staging
// modules with local paths), so go.mod here requires it and replaces every
// staging module k8s.io/<name> with its published tag v0.<minor>.<patch>.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
