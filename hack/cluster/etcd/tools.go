//go:build tools

// Package tools pins the etcd server. go.etcd.io/etcd/server/v3 has local
// replace directives, so it cannot be `go install`ed; a wrapper module can
// build it because a dependency's replaces are ignored.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
